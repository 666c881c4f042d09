"""GPU timing: CUDA-graph replays timed with CUDA events, their spread, and the ceilings (copy
bandwidth, TF32 and FP32 matmul throughput).

Kernels of a few microseconds cost more to launch from Python (about 10 us) than to run, so
they are captured once in a CUDA graph and the graph is replayed: several replays per pair
of events, the median over many pairs. cupy and torch are imported here only when called.

Graph capture works only if `fn` launches on the capturing stream. foxcute's kernels fetch
the array library's current stream when they are called, so `fn` must do the call itself
(not hand out a launch prepared earlier). A capture that missed the stream raises no error:
the graph is empty and replays in no time. `check_graph_replay(fn)` catches that: it fills
what `fn` returned with NaN and demands that one replay rewrites all of it. Call it once per
benchmarked function before trusting a time.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

LIBRARIES = ("cupy", "torch")


def _check_library(library: str) -> None:
    if library not in LIBRARIES:
        raise ValueError(f"library must be one of {LIBRARIES}, got {library!r}")


class _Cupy:
    """The few stream, event and graph calls `bench` needs, on cupy."""

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=True)

    def run_on_stream(self, fn: Callable[[], Any], times: int) -> None:
        with self.stream:
            for _ in range(times):
                fn()
        self.stream.synchronize()

    def capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        with self.stream:
            # Relaxed: the memory pool may call cudaMalloc while fn allocates its outputs.
            self.stream.begin_capture(self.cupy.cuda.runtime.streamCaptureModeRelaxed)
            try:
                out = fn()
            finally:
                graph = self.stream.end_capture()
        graph.upload(self.stream)
        return graph, out

    def replay(self, graph: Any) -> None:
        graph.launch(self.stream)

    def timed(self, body: Callable[[], None]) -> float:
        """Milliseconds between two events around `body`'s launches on our stream."""
        start, end = self.cupy.cuda.Event(), self.cupy.cuda.Event()
        with self.stream:
            start.record(self.stream)
            body()
            end.record(self.stream)
        end.synchronize()
        return self.cupy.cuda.get_elapsed_time(start, end)

    def synchronize(self) -> None:
        self.cupy.cuda.Device().synchronize()


class _Torch:
    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.stream = torch.cuda.Stream()

    def run_on_stream(self, fn: Callable[[], Any], times: int) -> None:
        # torch requires warm-up (lazy init, allocator growth) on a side stream before capture.
        self.stream.wait_stream(self.torch.cuda.current_stream())
        with self.torch.cuda.stream(self.stream):
            for _ in range(times):
                fn()
        self.torch.cuda.current_stream().wait_stream(self.stream)
        self.torch.cuda.synchronize()

    def capture(self, fn: Callable[[], Any]) -> tuple[Any, Any]:
        graph = self.torch.cuda.CUDAGraph()
        with self.torch.cuda.graph(graph, stream=self.stream):
            out = fn()
        return graph, out

    def replay(self, graph: Any) -> None:
        graph.replay()

    def timed(self, body: Callable[[], None]) -> float:
        start = self.torch.cuda.Event(enable_timing=True)
        end = self.torch.cuda.Event(enable_timing=True)
        with self.torch.cuda.stream(self.stream):
            start.record()
            body()
            end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()


def _backend(library: str) -> _Cupy | _Torch:
    _check_library(library)
    return _Cupy() if library == "cupy" else _Torch()


def bench(fn: Callable[[], Any], *, graph: bool = True, warmup: int = 5, reps: int = 50,
          calls_per_rep: int = 10, library: str = "cupy", budget_s: float = 5.0) -> tuple[float, list[float]]:
    """Median microseconds per call of `fn` and the per-call samples (one per event pair).

    graph=True: `fn` is captured once in a CUDA graph (after `warmup` plain calls, which also
    compile), and each sample times `calls_per_rep` back-to-back replays. graph=False: each
    sample times `calls_per_rep` plain calls, launch overhead included. `library` is the array
    library of `fn`'s arrays ("cupy" or "torch"): its current stream is the one captured.
    A slow `fn` (a naive kernel can take tens of milliseconds) gets fewer samples, at least
    5 single calls, so that one measurement stays near `budget_s` seconds.
    """
    lib = _backend(library)
    lib.run_on_stream(fn, warmup)
    if graph:
        cuda_graph, graph_outputs = lib.capture(fn)  # held: replays write into them
        lib.replay(cuda_graph)  # first replay pays the graph's upload and instantiation
        lib.synchronize()

        def body() -> None:
            for _ in range(calls_per_rep):
                lib.replay(cuda_graph)
    else:
        def body() -> None:  # `timed` makes the timing stream current around this
            for _ in range(calls_per_rep):
                fn()

    first_ms = lib.timed(body) / calls_per_rep
    if first_ms * calls_per_rep * reps > budget_s * 1e3:
        calls_per_rep = 1
        reps = max(5, min(reps, int(budget_s * 1e3 / max(first_ms, 1e-6))))
    samples = [lib.timed(body) * 1e3 / calls_per_rep for _ in range(reps)]
    return statistics.median(samples), samples


def spread(samples: list[float]) -> dict[str, float]:
    """A timing record's fields from `bench`'s samples: "time_us" the median (bench's first
    return value), "time_us_p10" and "time_us_p90" the 10th and 90th percentiles (linear
    interpolation between samples), the spread a reader weighs a difference against."""
    if not samples:
        raise ValueError("timing.spread: no samples")
    ordered = sorted(samples)

    def percentile(q: float) -> float:
        at = q * (len(ordered) - 1)
        low = int(at)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (at - low)
    return {"time_us": statistics.median(ordered), "time_us_p10": percentile(0.1),
            "time_us_p90": percentile(0.9)}


def _arrays_of(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [a for item in out for a in _arrays_of(item)]
    return [out] if hasattr(out, "shape") else []


def check_graph_replay(fn: Callable[[], Any], *, library: str = "cupy") -> None:
    """Raise AssertionError unless replaying `fn`'s CUDA graph rewrites every float array it
    returns (an empty capture replays as a no-op and would time as free)."""
    lib = _backend(library)
    lib.run_on_stream(fn, 1)
    cuda_graph, out = lib.capture(fn)
    floats = [a for a in _arrays_of(out) if "float" in str(a.dtype)]
    if not floats:
        raise AssertionError("check_graph_replay: fn returned no float arrays to check")
    # work that missed the capture ran eagerly on another stream: let it finish before the
    # poisoning, or it may land after it and pass for the replay (seen under pytest -n 12)
    lib.synchronize()
    for a in floats:
        a[...] = float("nan")
    lib.synchronize()
    lib.replay(cuda_graph)
    lib.synchronize()
    for i, a in enumerate(floats):
        finite = bool(a.isfinite().all()) if library == "torch" else bool(lib.cupy.isfinite(a).all())
        if not finite:
            raise AssertionError(f"check_graph_replay: output {i} (shape {tuple(a.shape)}) was not "
                                 f"rewritten by the replay: the kernel did not launch on the "
                                 f"capturing stream")


def copy_bandwidth_TBps(nbytes: int = 4 << 30, *, reps: int = 30, warm_s: float = 0.3,
                       library: str = "cupy") -> float:
    """Device-to-device copy bandwidth in TB/s (1e12 bytes/s), read and write both counted:
    the ceiling every memory-bound kernel here is compared against. Plain copies after `warm_s`
    seconds of copying, timed with events: on the H200 they read 3.97, 4.17 and 4.28 TB/s for
    0.25, 1 and 4 GiB, hence 4 GiB. (The same copy captured in a CUDA graph read 2.8 TB/s:
    never take the ceiling from a graph.)"""
    import time

    lib = _backend(library)
    n = nbytes // 4
    if library == "cupy":
        src = lib.cupy.ones(n, dtype="float32")
        dst = lib.cupy.empty_like(src)

        def copy() -> None:
            lib.cupy.copyto(dst, src)
    else:
        src = lib.torch.ones(n, dtype=lib.torch.float32, device="cuda")
        dst = lib.torch.empty_like(src)

        def copy() -> None:
            dst.copy_(src)
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        lib.run_on_stream(copy, 3)
    ms = statistics.median(lib.timed(copy) for _ in range(reps))
    return 2 * n * 4 / (ms * 1e-3) / 1e12


def matmul_TFLOPs(*, tf32: bool, n: int = 8192, reps: int = 10, warm_s: float = 0.3) -> float:
    """Compute ceiling in TFLOP/s (1e12 FLOP/s): a float32 [n x n] @ [n x n] torch matmul
    (cuBLAS), 2 n^3 FLOP per call, with TF32 tensor cores allowed (tf32=True) or forbidden
    (torch.backends.cuda.matmul.allow_tf32, restored after). Plain calls after `warm_s`
    seconds of them, the median of `reps` event-timed calls: at n = 8192 a call takes
    milliseconds, so launch cost is noise. The roofline's compute ceilings beside the copy
    ceiling; needs torch."""
    import time

    lib = _Torch()
    torch = lib.torch
    a = torch.randn(n, n, device="cuda")
    b = torch.randn(n, n, device="cuda")
    c = torch.empty(n, n, device="cuda")
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        def matmul() -> None:
            torch.matmul(a, b, out=c)
        start = time.perf_counter()
        while time.perf_counter() - start < warm_s:
            lib.run_on_stream(matmul, 2)
        ms = statistics.median(lib.timed(matmul) for _ in range(reps))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2.0 * n**3 / (ms * 1e-3) / 1e12


def launch_floor_us(*, library: str = "cupy", **bench_kwargs: Any) -> float:
    """Median microseconds per CUDA-graph replay of one trivial kernel (a one-float fill),
    timed as `bench` times every implementation: the part of a single-kernel layer's time that
    no kernel design removes (the graph launch, one kernel's start and drain)."""
    lib = _backend(library)
    if library == "cupy":
        x = lib.cupy.zeros(1, dtype="float32")
        fill_x = x.fill
    else:
        x = lib.torch.zeros(1, dtype=lib.torch.float32, device="cuda")
        fill_x = x.fill_

    def fill() -> Any:
        fill_x(1.0)
        return x  # returned so that check_graph_replay sees the replay rewrite it
    check_graph_replay(fill, library=library)
    return bench(fill, library=library, **bench_kwargs)[0]


def floor_us(bytes_moved: float, bandwidth_TBps: float) -> float:
    """Time in microseconds to move `bytes_moved` at `bandwidth_TBps`: a memory-bound floor."""
    return bytes_moved / (bandwidth_TBps * 1e12) * 1e6
