"""What every CuTe DSL kernel in foxcute shares: importing the DSL for the right target,
compiling once per static configuration, and handing device arrays to compiled kernels.

Kernels take raw global-memory pointers and int32 sizes, and build their tensors inside the
jit function. That one calling convention serves cupy and torch alike, costs no DLPack
round trip per launch, and compiles on a machine without a GPU from null pointers.

Compiling: each kernel module keeps a `CompiledCache(__name__)` and asks it for a kernel by
its static parameters with `get(key, build)`, `build` calling `compile_kernel`. A kernel is
compiled once per process, and once per machine: the cache stores what it compiles on disk
(_compile_cache: keyed by the module, the key, the kernel sources, the DSL version, the
arch and the compile options) and a new process loads it instead of compiling (a few ms
against 0.1-3 s a kernel). FOXCUTE_CACHE=0 turns the disk part off.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_ptr

from .. import _arrays
from . import _compile_cache

ARCH = os.environ["CUTE_DSL_ARCH"]
COMPILE_OPTIONS = ""  # cute.compile's options for kernels run (the DSL's defaults); in the disk cache's key
ALIGN = 16  # bytes; every kernel assumes its arrays start on a 128-bit boundary

_compile_lock = threading.Lock()  # cute.compile is not thread-safe


class CompiledCache:
    """Compiled executors of one kernel module, keyed by its static parameters (cute.compile
    has no cache of its own): in memory for the process, on disk (_compile_cache) for the
    machine. `module` names the key space on disk: the module's __name__.

    `get(key, build)`: the kernel in memory, else loaded from disk, else `build()` (which
    calls compile_kernel) and stored on disk. key must be a tuple of str, int, float, bool,
    None and tuples of them, and must tell apart every compile `build` can make, `keep`
    included. Kept compiles (PTX and cubin for CI) are never stored, so never loaded."""

    def __init__(self, module: str) -> None:
        self.module = module
        self._entries: dict[tuple, Any] = {}

    def get(self, key: tuple, build: Callable[[], Any]) -> Any:
        fn = self._entries.get(key)
        if fn is None:
            with _compile_lock:
                fn = self._entries.get(key)
                if fn is None:
                    fn = _compile_cache.load(self.module, key)
                    if fn is None:
                        fn = build()
                        if fn.__ptx__ is None:
                            _compile_cache.store(self.module, key, fn)
                    self._entries[key] = fn
        return fn


def compile_kernel(jit_fn: Callable, *args: Any, keep: bool = False) -> Any:
    """cute.compile. With `keep`, also the PTX and cubin (`__ptx__`, `__cubin__`: CI checks
    them) and ptxas' resource report of the same compile as `ptxas_resources` (registers,
    stack frame, spill stores and loads: see `parse_ptxas_report`)."""
    if not keep:
        return cute.compile(jit_fn, *args, options=COMPILE_OPTIONS)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ptxas.yaml")
        # one options string: options= replaces the KeepPTX / KeepCUBIN flags of cute.compile[...].
        # The PTX and cubin go to this compile's own folder (the DSL reads them back before it
        # returns): in the shared CUTE_DSL_DUMP_DIR, a concurrent compile of a kernel with the
        # same name (another precision, in another process) could overwrite them in between.
        compiled = cute.compile(jit_fn, *args, options=f"--keep-ptx --keep-cubin --dump-dir {tmp} "
                                                       f"--remark-filter ptxas --remark-output {path}")
        compiled.ptxas_resources = parse_ptxas_report(open(path).read())
    return compiled


def parse_ptxas_report(text: str) -> dict[str, int]:
    """ptxas' resource report (its remarks) as registers, stack_frame, spill_stores and
    spill_loads (bytes); RuntimeError when the text holds none."""
    import re

    used = re.search(r"Used (\d+) registers", text)
    frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", text)
    if not used or not frame:
        raise RuntimeError(f"no ptxas resource report in:\n{text}")
    return {"registers": int(used.group(1)), "stack_frame": int(frame.group(1)),
            "spill_stores": int(frame.group(2)), "spill_loads": int(frame.group(3))}


def fake_ptr(dtype: type = cutlass.Float32) -> cute.Pointer:
    """A null global pointer with the alignment the kernels assume: enough to compile."""
    return make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=ALIGN)


def fake_stream() -> cuda.CUstream:
    return cuda.CUstream(0)


def gmem_ptr(x: Any, dtype: type = cutlass.Float32) -> cute.Pointer:
    return make_ptr(dtype, _arrays.data_ptr(x, _arrays.array_kind(x)), cute.AddressSpace.gmem,
                    assumed_align=ALIGN)


def current_stream(x: Any) -> cuda.CUstream:
    """x's library's current stream (`_arrays.current_stream_handle`) as the DSL takes it."""
    return cuda.CUstream(_arrays.current_stream_handle(x))


def is_capturing(x: Any) -> bool:
    """Whether x's library is capturing a CUDA graph on its current stream."""
    if hasattr(x, "data_ptr"):
        import torch

        return torch.cuda.is_current_stream_capturing()
    import cupy

    return cupy.cuda.get_current_stream().is_capturing()


def synchronize(x: Any) -> None:
    if hasattr(x, "data_ptr"):
        import torch

        torch.cuda.synchronize(x.device)
    else:
        x.device.synchronize()


TICKET_SLOTS = 1024  # launches that may be in flight at once on one device
TICKETS_PER_LAUNCH = 256  # integers one launch may count with (column slices, output tiles)
_ticket_pools: dict[tuple, list] = {}


def tickets(x: Any, count: int) -> Any:
    """`count` zeroed int32 tickets for one launch on x's device (the fixed-order reductions'
    "last CTA finishes" counters), 16-byte aligned, from a per-device pool used round robin.
    The launch's finishing CTAs set them back to zero, so no memset precedes each launch (in
    a CUDA graph that would be one more node, ~1-2 us). A launch needs its slot back only
    after TICKET_SLOTS further launches on the device."""
    if count > TICKETS_PER_LAUNCH:
        raise ValueError(f"a launch may take at most {TICKETS_PER_LAUNCH} tickets, not {count}")
    kind = _arrays.array_kind(x)
    key = (kind, _arrays.device_id(x, kind))
    pool = _ticket_pools.get(key)
    if pool is None:
        if is_capturing(x):
            raise RuntimeError("foxcute: the first reduction kernel on a device cannot be launched "
                               "inside CUDA graph capture (it allocates the ticket pool); call it "
                               "once before capturing, as torch.cuda.graph's warm-up does")
        pool = _ticket_pools[key] = [_arrays.zeros(x, (TICKETS_PER_LAUNCH * TICKET_SLOTS,), "int32"), 0]
        synchronize(x)  # the pool must be zero before a launch on any stream reads it
    zeros, slot = pool
    pool[1] = (slot + 1) % TICKET_SLOTS
    return zeros[TICKETS_PER_LAUNCH * slot: TICKETS_PER_LAUNCH * slot + count]


@cute.jit
def relu(x: cutlass.Float32) -> cutlass.Float32:
    return x if x > cutlass.Float32(0.0) else cutlass.Float32(0.0)


@cute.jit
def take_ticket(mTicket: cute.Tensor, t: cutlass.Int32, tid: cutlass.Int32, sTicket: cute.Tensor) -> cutlass.Int32:
    """Publish this CTA's global writes, then draw ticket t once for the whole CTA (0, 1, ...:
    the CTA that draws count - 1 is the last to arrive, and reads the others' writes after a
    gpu-scope fence of its own). sTicket: one Int32 of shared memory."""
    cute.arch.fence_acq_rel_gpu()
    cute.arch.sync_threads()
    if tid == 0:
        sTicket[0] = cute.arch.atomic_add(mTicket.iterator + t, cutlass.Int32(1), sem="acq_rel", scope="gpu")
    cute.arch.sync_threads()
    return sTicket[0]


# Arrive, wait, depart: a counter that CTAs of one launch meet at. Waiting completes only if
# every counted CTA gets to run while the others wait: a cooperative launch guarantees it (the
# KAN backward's); KMajorWeightGrad relies on in-order dispatch instead (see it).
@cute.jit
def arrive(mCounters: cute.Tensor, i: cutlass.Int32, tid: cutlass.Int32) -> cutlass.Int32:
    """Publish this CTA's global writes and count it in at counter i. Returns (to thread 0,
    0 to the others) the count so far, this CTA included: wait_for_arrivals starts from it."""
    cute.arch.fence_acq_rel_gpu()
    cute.arch.sync_threads()
    arrived = cutlass.Int32(0)
    if tid == 0:
        arrived = cute.arch.atomic_add(mCounters.iterator + i, cutlass.Int32(1), sem="acq_rel", scope="gpu") + 1
    return arrived


@cute.jit
def wait_for_arrivals(mCounters: cute.Tensor, i: cutlass.Int32, arrived: cutlass.Int32,
                      count: cutlass.Int32, tid: cutlass.Int32):
    """Wait until `count` CTAs have arrived at counter i; then every thread sees what they
    published."""
    if tid == 0:
        while arrived < count:
            arrived = cute.arch.load(mCounters.iterator + i, cutlass.Int32, sem="acquire", scope="gpu")
    cute.arch.sync_threads()
    cute.arch.fence_acq_rel_gpu()


@cute.jit
def depart(mCounters: cute.Tensor, i: cutlass.Int32, count: cutlass.Int32, tid: cutlass.Int32):
    """Count this CTA, done with the others' writes, out of counter i: every CTA counts it up
    once more, so the last of the `count` to leave (it draws 2 count - 1) knows that all
    have passed their wait, and zeroes it for the next launch (or graph replay)."""
    if tid == 0:
        if cute.arch.atomic_add(mCounters.iterator + i, cutlass.Int32(1), sem="relaxed", scope="gpu") == 2 * count - 1:
            mCounters[i] = cutlass.Int32(0)


@cute.jit
def sum_rows_in_order(mRows: cute.Tensor, first_row: cutlass.Int32, count: cutlass.Int32,
                      tid: cutlass.Int32, acc: cute.Tensor, threads: cutlass.Constexpr[int],
                      row_vecs: cutlass.Constexpr[int], rows_per_step: cutlass.Constexpr[int]):
    """The finishing CTA's part of a fixed-order batch reduction: acc[v, :] <- the sum of
    float4 vector tid + v*threads of rows first_row, first_row + 1, ..., first_row + count - 1
    of mRows [rows, row_vecs, 4], added in that order (bit-identical run to run). Each step
    issues rows_per_step rows' loads before its first add, so they are in flight together;
    rows past count and vectors past row_vecs read as zeros, which add exactly nothing."""
    vecs_per_thread = cute.size(acc, mode=[0])
    acc.fill(0.0)
    for base in cutlass.range(0, count, rows_per_step, unroll=1):
        rows = cute.make_rmem_tensor((rows_per_step, vecs_per_thread, 4), cutlass.Float32)
        for r in cutlass.range_constexpr(rows_per_step):
            for v in cutlass.range_constexpr(vecs_per_thread):
                vec = tid + v * threads
                if base + r < count and vec < row_vecs:
                    rows[r, v, None].store(mRows[first_row + base + r, vec, None].load())
                else:
                    rows[r, v, None].fill(0.0)
        for r in cutlass.range_constexpr(rows_per_step):
            for v in cutlass.range_constexpr(vecs_per_thread):
                acc[v, None].store(acc[v, None].load() + rows[r, v, None].load())


@cute.jit
def sum_slice_in_order(mRows: cute.Tensor, first_row: cutlass.Int32, num_rows: cutlass.Int32,
                       slice_index: cutlass.Int32, tid: cutlass.Int32, threads: cutlass.Constexpr[int],
                       loads: cutlass.Constexpr[int], store: Callable):
    """A spread finish's part of one CTA (after wait_for_arrivals): slice `slice_index` of
    the num_rows rows first_row .. of mRows [rows, vecs, 4], one slice a row, each float4
    vector of it summed over the rows in order (sum_vector_in_order) and handed to
    store(vec, total) by one lane. `parts` (8, 4, 2 or 1) adjacent lanes take a vector: the
    most that keeps the slice within one pass of the CTA's threads where it can."""
    row_vecs = cute.size(mRows, mode=[1])
    per_slice = (row_vecs + num_rows - 1) // num_rows
    first = slice_index * per_slice
    last = cutlass.min(first + per_slice, row_vecs)
    parts = cutlass.Int32(1)
    for p in (2, 4, 8):
        if per_slice * p <= threads:
            parts = cutlass.Int32(p)
    passes = (per_slice + threads // parts - 1) // (threads // parts)
    acc = cute.make_rmem_tensor((1, 4), cutlass.Float32)
    for pss in cutlass.range(passes, unroll=1):
        vec = first + pss * (threads // parts) + tid // parts
        sum_vector_in_order(mRows, first_row, num_rows, vec, last, parts, tid, acc, loads)
        if tid % parts == 0 and vec < last:
            store(vec, acc[0, None])


@cute.jit
def sum_vector_in_order(mRows: cute.Tensor, first_row: cutlass.Int32, num_rows: cutlass.Int32,
                        vec: cutlass.Int32, last: cutlass.Int32, parts: cutlass.Int32, tid: cutlass.Int32,
                        acc: cute.Tensor, loads: cutlass.Constexpr[int]):
    """acc[0, :] <- float4 vector vec (< last, else nothing is loaded) of rows first_row ..
    first_row + num_rows - 1 of mRows [rows, vecs, 4], summed by `parts` adjacent lanes: lane
    p adds the p-th run of the rows in order (`loads` rows' loads in flight at once), then
    the runs are added by a butterfly over the parts, a fixed tree (x + y and y + x are the
    same bits), so every lane of the group holds the same total. All lanes must call it."""
    part = tid % parts
    run = (num_rows + parts - 1) // parts
    run_first = cutlass.min(part * run, num_rows)
    count = cutlass.select_(vec < last, cutlass.min(run, num_rows - run_first), cutlass.Int32(0))
    sum_rows_in_order(mRows, first_row + run_first, count, vec, acc, 1, cute.size(mRows, mode=[1]), loads)
    for offset in (1, 2, 4):
        if offset < parts:
            for e in cutlass.range_constexpr(4):
                acc[0, e] = acc[0, e] + cute.arch.shuffle_sync_bfly(acc[0, e], offset=offset)


def ptxas_report(jit_fn: Callable, *args: Any) -> dict[str, int]:
    """Compile once more with ptxas' remarks on and return its resource report for the
    kernel: registers, stack frame and spill bytes (what CI checks: no spills)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ptxas.yaml")
        with _compile_lock:
            cute.compile(jit_fn, *args, options=f"--remark-filter ptxas --remark-output {path}")
        return parse_ptxas_report(open(path).read())
