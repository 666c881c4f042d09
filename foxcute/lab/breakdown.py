"""Where one training step's time goes: a per-kernel table in the shape of the trainer's
profile (kernel, share of step time, us per call, calls per step) for the naive and the cute
step, the naive/cute ratio per layer, and the headline step records for the profiling notebook.

Method. Each part of the step (foxcute.step.PARTS) runs once, after a validating `run` that
also compiled every kernel, inside its own `torch.profiler.profile(activities=[CPU, CUDA])`
session: CUPTI records every kernel launched on the device, the CuTe DSL's included. A kernel
is attributed to the part whose session saw it, so a kernel shared by several layers (the
column sum, the naive batch sum) is counted where it ran; no clock alignment is involved.
Kernel device times come from the session's Chrome trace (events of category "kernel",
"gpu_memset", "gpu_memcpy"). If the profiler records no device event at all, the fallback
times each part as a whole with foxcute.lab.timing.bench (CUDA-graph replays for cute, plain calls
for naive); the table's "method" column says which produced it.

"share of step (%)" is a kernel's device time over the device time of all kernels of the
step (launch gaps excluded); the step's wall time is the headline record's. Where the step's
two lanes overlap, those shares overstate what a part costs the step: `marginal_costs` times
the graph-replayed cute step without each part and with it alone.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pkgutil
import re
import tempfile
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pandas as pd

from .. import step
from .._arrays import array_kind
from ..checks import worst

PROFILER = "torch.profiler (CUPTI device activity)"
BENCH = "timing.bench per part (no kernel events recorded)"
DEVICE_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")
TABLE_COLUMNS = ["backend", "layer", "kernel", "share of step (%)", "us per call", "calls per step",
                 "total us", "method"]
LAUNCH_COLUMNS = ["part", "launch", "kernel", "start (us)", "us", "share of part (%)"]  # launch_table's
MARGINAL_COLUMNS = ["part", "lane", "alone (us)", "step without it (us)", "marginal (us)", "step (us)"]
LANE_COLUMNS = ["lane", "name", "start_us", "duration_us"]  # lane_frame's
REPORT_JOIN_COLUMNS = ["case", "impl", "kernel", "launches", "device us", "compiled as", "registers",
                       "mma_sync_tf32", "wgmma_tf32", "ld_st_local"]  # join_kernel_report's
# step_records' default: torch_compile_cudagraphs (torch's own CUDA graphs behind a Python call,
# host time included) is accepted by name but not timed by default
STEP_IMPLS = ("naive", "cute", "cute_one_stream", "torch_ops", "torch_ops_graph", "torch_ops_compile",
              "torch_eager", "torch_compile", "torch_max_autotune")
# the step through foxcute's PyTorch operators (foxcute.torch.step): plain calls (what eager
# PyTorch code pays, host included), captured in one CUDA graph, and under
# torch.compile(fullgraph=True) captured likewise
_OPERATOR_STEPS = ("torch_ops", "torch_ops_graph", "torch_ops_compile")
_TORCH_MODES = {"torch_eager": "eager", "torch_compile": "compile",
                "torch_max_autotune": "max-autotune-no-cudagraphs",
                "torch_compile_cudagraphs": "reduce-overhead"}  # foxcute.peers.step.Step modes
GRAPH_REPLAY = "CUDA graph replay"  # a record's "timing" when timing.bench replayed a captured graph
# the torch peers captured in one CUDA graph and replayed, as the cute step is
_GRAPH_REPLAYED_TORCH = ("torch_compile", "torch_max_autotune")

# kernel_cutlass_<method>_foxcutekernels<module><Class>_object_at_...: <method> is the
# @cute.kernel method's name ("kernel", or e.g. "kernel_wgmma" where a class has two)
_DSL_NAME = re.compile(r"kernel_cutlass_(\w+?)_(?:foxcutekernels)?(\w+?)_object_at_")
_DSL_METHOD_NAME = re.compile(r"kernel_cutlass_(\w+?)_foxcutekernels(\w+?)_object_at_")


@dataclasses.dataclass(frozen=True)
class KernelEvent:
    """One device activity of one part of the step (start_us: its start in the trace)."""

    part: str
    name: str
    us: float
    start_us: float = 0.0
    stream: int | None = None  # the CUDA stream it ran on, where the trace says


def _kernel_modules() -> list[str]:
    from .. import kernels

    return sorted((m.name for m in pkgutil.iter_modules(kernels.__path__)), key=len, reverse=True)


def short_kernel_name(name: str, modules: Sequence[str] | None = None) -> str:
    """A readable kernel name: "module.Class" for foxcute's CuTe DSL kernels (the DSL names
    them kernel_cutlass_kernel_foxcutekernels<module><Class>_object_at_<arguments>), with
    ".method" where the @cute.kernel method is not `kernel`; the name without arguments or
    template parameters for anything else."""
    found = _DSL_METHOD_NAME.search(name) or _DSL_NAME.search(name)
    if found:
        method, joined = found.groups()
        suffix = "" if method == "kernel" else f".{method}"
        for module in (_kernel_modules() if modules is None else modules):
            if joined.startswith(module) and len(joined) > len(module):
                return f"{module}.{joined[len(module):]}{suffix}"
        return joined + suffix
    plain = name.removeprefix("void ")
    cut = min((i for i in (plain.find("<"), plain.find("(")) if i > 0), default=len(plain))
    return plain[:cut].strip()


def events_from_trace(trace: dict[str, Any], part: str) -> list[KernelEvent]:
    """The device activities of a Chrome trace (torch.profiler's export) as events of `part`."""
    return [KernelEvent(part, e["name"], float(e["dur"]), float(e.get("ts", 0.0)), _stream_of(e))
            for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]


def _stream_of(event: dict[str, Any]) -> int | None:
    """A device event's stream: args.stream in torch.profiler's traces (its tid as well)."""
    stream = (event.get("args") or {}).get("stream", event.get("tid"))
    try:
        return int(stream)
    except (TypeError, ValueError):
        return None


def lane_frame(events: Iterable[KernelEvent], modules: Sequence[str] | None = None) -> pd.DataFrame:
    """Device events of one call as a timeline (LANE_COLUMNS): one lane per CUDA stream,
    "main" for the stream of the first event, "side" for the next if there are two, else
    "stream <id>" for the others; names short (short_kernel_name), start_us from the first
    event's start; rows in start order."""
    events = sorted(events, key=lambda e: e.start_us)
    if not events:
        return pd.DataFrame(columns=LANE_COLUMNS)
    streams = list(dict.fromkeys(e.stream for e in events))
    names = {streams[0]: "main"}
    if len(streams) == 2:
        names[streams[1]] = "side"
    names.update({s: f"stream {s}" for s in streams if s not in names})
    modules = _kernel_modules() if modules is None else modules
    t0 = events[0].start_us
    return pd.DataFrame([(names[e.stream], short_kernel_name(e.name, modules), e.start_us - t0, e.us)
                         for e in events], columns=LANE_COLUMNS)


def lane_events(inputs: dict[str, dict[str, Any]], *, precision: str = "tf32", impl: str = "fused") -> pd.DataFrame:
    """The two-lane cute step (step.kernel_step, lanes on) called once untimed, then once
    under torch.profiler as a plain call: its kernels per stream (lane_frame), for a timeline
    of the lanes. One profiled call, not a median; `inputs` as for step_breakdown."""
    if array_kind(inputs["mamba2"]["h"]) != "torch":
        raise ValueError("foxcute.lab.breakdown.lane_events: the inputs must be torch CUDA tensors")
    fn = step.kernel_step(inputs, precision=precision, impl=impl, lanes=True)
    fn()
    return lane_frame(_profile_parts([("step", fn)]))


def join_kernel_report(launches: pd.DataFrame, report: pd.DataFrame) -> pd.DataFrame:
    """The compile report beside what was timed (REPORT_JOIN_COLUMNS): `launches` is
    launch_table's frame of profiled calls whose part is "<case>|<impl>", `report` the
    kernel report: "kernel" compiled_for_ci's name for a compiled configuration (here
    "compiled as"), "kernel class" its kernel in short_kernel_name's form ("module.Class"),
    and the facts (registers, instruction counts). Each kernel a call launched, with its launches
    and summed device us, gets one row per compiled configuration of its class (registers
    and instruction counts differ between them); a kernel without a report row (not one of
    foxcute's, a memset) keeps it with empty report columns."""
    if launches.empty:
        return pd.DataFrame(columns=REPORT_JOIN_COLUMNS)
    per_call = (launches.groupby(["part", "kernel"], sort=False)["us"].agg(["count", "sum"]).reset_index()
                .rename(columns={"count": "launches", "sum": "device us"}))
    split = per_call["part"].str.split("|", n=1, expand=True)
    per_call["case"], per_call["impl"] = split[0], split[1]
    report = report.rename(columns={"kernel": "compiled as"}).rename(columns={"kernel class": "kernel"})
    report_columns = [c for c in REPORT_JOIN_COLUMNS if c in report.columns and c != "kernel"]
    joined = per_call.merge(report[["kernel", *report_columns]], on="kernel", how="left")
    return joined.reindex(columns=REPORT_JOIN_COLUMNS).reset_index(drop=True)


def kernel_table(events: Iterable[KernelEvent], *, backend: str, method: str = PROFILER,
                 modules: Sequence[str] | None = None) -> pd.DataFrame:
    """Events of one step aggregated per (part, kernel): calls per step, us per call (mean),
    total us and share of the step's device time; largest first. The trainer's table shape."""
    modules = _kernel_modules() if modules is None else modules
    rows = pd.DataFrame([(e.part, short_kernel_name(e.name, modules), e.us) for e in events],
                        columns=["layer", "kernel", "us"])
    if rows.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    table = rows.groupby(["layer", "kernel"], sort=False)["us"].agg(["count", "mean", "sum"]).reset_index()
    table = table.rename(columns={"count": "calls per step", "mean": "us per call", "sum": "total us"})
    table["share of step (%)"] = 100.0 * table["total us"] / table["total us"].sum()
    table["backend"] = backend
    table["method"] = method
    return table.sort_values("total us", ascending=False, kind="stable")[TABLE_COLUMNS].reset_index(drop=True)


def launch_table(events: Iterable[KernelEvent], modules: Sequence[str] | None = None) -> pd.DataFrame:
    """Every event its own row (LAUNCH_COLUMNS), each part's in start order and numbered from
    1, with its start after the part's first and its share of the part's device time: where
    one layer call's time goes (kernels on side lanes overlap: a start before the previous
    row's start + us)."""
    modules = _kernel_modules() if modules is None else modules
    rows = pd.DataFrame([(e.part, e.start_us, short_kernel_name(e.name, modules), e.us) for e in events],
                        columns=["part", "start", "kernel", "us"])
    if rows.empty:
        return pd.DataFrame(columns=LAUNCH_COLUMNS)
    rows["part order"] = rows["part"].map(list(dict.fromkeys(rows["part"])).index)  # parts as given
    rows = rows.sort_values(["part order", "start"], kind="stable")
    rows["launch"] = rows.groupby("part", sort=False).cumcount() + 1
    rows["start (us)"] = rows["start"] - rows.groupby("part", sort=False)["start"].transform("min")
    rows["share of part (%)"] = 100.0 * rows["us"] / rows.groupby("part", sort=False)["us"].transform("sum")
    return rows[LAUNCH_COLUMNS].reset_index(drop=True)


def launch_breakdown(parts: list[tuple[str, Callable[[], Any]]]) -> pd.DataFrame:
    """Each (name, function) called once untimed (compiles, allocator growth), then once under
    the profiler: launch_table of the device activities each call ran (e.g. one layer's
    implementations side by side)."""
    for _, run_part in parts:
        run_part()
    return launch_table(_profile_parts(parts))


def part_table(part_us: dict[str, float], *, backend: str, method: str = BENCH) -> pd.DataFrame:
    """The fallback's table: one row per part, its time as a whole ("all kernels")."""
    events = [KernelEvent(part, "(all kernels of the part)", us) for part, us in part_us.items()]
    table = kernel_table(events, backend=backend, method=method, modules=())
    table["calls per step"] = np.nan  # not known without kernel events
    return table


def layer_ratio(naive: pd.DataFrame, cute: pd.DataFrame) -> pd.DataFrame:
    """Per part of the step: naive and cute device time (us) and naive / cute, with the
    whole step as the last row."""
    per_part = pd.DataFrame({"naive us": naive.groupby("layer", sort=False)["total us"].sum(),
                             "cute us": cute.groupby("layer", sort=False)["total us"].sum()})
    per_part = per_part.reindex([p for p in step.PARTS if p in per_part.index]
                                + [p for p in per_part.index if p not in step.PARTS])
    per_part.loc["step"] = per_part.sum(min_count=1)
    per_part["naive / cute"] = per_part["naive us"] / per_part["cute us"]
    per_part.index.name = "layer"
    return per_part


def _profile_parts(parts: list[tuple[str, Callable[[], Any]]]) -> list[KernelEvent]:
    """Each part once in its own profiler session; the device events each session recorded."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    events: list[KernelEvent] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (part, run_part) in enumerate(parts):
            torch.cuda.synchronize()
            # CPU activity too, as torch.profiler is commonly run (device events correlated with
            # their launches); only the device events are read back
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                run_part()
                torch.cuda.synchronize()
            path = os.path.join(tmp, f"{i}_{part}.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events += events_from_trace(json.load(f), part)
    return events


def _bench_parts(parts: list[tuple[str, Callable[[], None]]], backend: str, library: str) -> dict[str, float]:
    from . import timing

    settings = (dict(graph=False, warmup=0, reps=3, calls_per_rep=1) if backend == "naive"
                else dict(graph=True, warmup=3, reps=20, calls_per_rep=10))
    return {part: timing.bench(run_part, library=library, **settings)[0] for part, run_part in parts}


def step_breakdown(inputs: dict[str, dict[str, Any]], *, backend: str, precision: str = "tf32",
                   impl: str = "fused") -> pd.DataFrame:
    """The per-kernel table (TABLE_COLUMNS) of one step on `inputs` (torch CUDA tensors,
    step.to_device(..., "torch")) with backend "naive" or "cute"."""
    library = array_kind(inputs["mamba2"]["h"])
    if library != "torch":
        raise ValueError("foxcute.lab.breakdown: the inputs must be torch CUDA tensors (the profiler is torch's)")
    parts, _ = step.kernel_parts(inputs, backend=backend, precision=precision, impl=impl)
    for _, run_part in parts:  # one untimed pass: lazy module loads and allocator growth
        run_part()
    events = _profile_parts(parts)
    if events:
        return kernel_table(events, backend=backend)
    return part_table(_bench_parts(parts, backend, library), backend=backend)


def marginal_costs(inputs: dict[str, dict[str, Any]], *, precision: str = "tf32", impl: str = "fused",
                   rounds: int = 3, warmup: int = 5, reps: int = 50, calls_per_rep: int = 10) -> pd.DataFrame:
    """What each part costs the two-lane cute step (MARGINAL_COLUMNS, one row per PARTS name,
    in its order): the whole step graph-replayed, the step with the part left out
    (step.kernel_step's leave_out), the difference ("marginal"), and the part alone. In a
    graph whose lanes overlap, a part's marginal cost, not its kernels' sum, is what making
    it faster can gain the step (the per-kernel table's times add up to more than the step).
    Each time is the median over `rounds` rounds of timing.bench, the variants alternating
    within a round; `inputs` as for step_breakdown (torch CUDA tensors)."""
    from . import timing

    if array_kind(inputs["mamba2"]["h"]) != "torch":
        raise ValueError("foxcute.lab.breakdown.marginal_costs: the inputs must be torch CUDA tensors")
    variants = {"step": ()}
    for part in step.PARTS:
        variants[("without", part)] = (part,)
        variants[("alone", part)] = tuple(p for p in step.PARTS if p != part)
    functions = {key: step.kernel_step(inputs, precision=precision, impl=impl, leave_out=leave_out)
                 for key, leave_out in variants.items()}
    samples: dict[Any, list[float]] = {key: [] for key in functions}
    for _ in range(rounds):
        for key, fn in functions.items():
            samples[key].append(timing.bench(fn, library="torch", warmup=warmup, reps=reps,
                                             calls_per_rep=calls_per_rep)[0])
    us = {key: float(np.median(values)) for key, values in samples.items()}
    lane = {part: "side" if part in step.LANES[1] else "main" for part in step.PARTS}
    return pd.DataFrame([{"part": part, "lane": lane[part], "alone (us)": us[("alone", part)],
                          "step without it (us)": us[("without", part)],
                          "marginal (us)": us["step"] - us[("without", part)], "step (us)": us["step"]}
                         for part in step.PARTS], columns=MARGINAL_COLUMNS)


def _record(name: str, sizes: step.StepSizes, precision: str) -> dict[str, Any]:
    return {"layer": "step", "impl": name, "pass": "step",
            "params": {**dataclasses.asdict(sizes), "precision": precision},
            "time_us": None, "floor_us": None, "rel_err": None}


def step_records(sizes: step.StepSizes = step.StepSizes(), *, seed: int = 0,
                 impls: Sequence[str] = STEP_IMPLS, precision: str = "tf32", impl: str = "fused",
                 warmup: int = 5, reps: int = 50, calls_per_rep: int = 10, naive_reps: int = 3,
                 reference: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The headline: one record per implementation of the whole step (layer "step", pass
    "step", params the StepSizes and precision), in the profiling notebook's schema, with
    rel_err the worst over the step's outputs against the float64 reference given each layer's
    own inputs (step.reference_given; that output's name in "worst_output"), "timing" saying
    how it was timed (GRAPH_REPLAY or "plain calls") and the spread of its samples
    (timing.spread: time_us the median, time_us_p10, time_us_p90). A failing implementation
    gets an "error" instead of a time.

    cute: straight through the kernel modules, captured in one CUDA graph, replays timed
    (timing.bench, after timing.check_graph_replay): the way the cute step is meant to run,
    the parts of step.LANES[1] on a second stream; cute_one_stream: the same on one stream.
    naive: plain calls, `naive_reps` of them (a naive step takes seconds). torch_ops: the
    step through foxcute's PyTorch operators (foxcute.torch.step, one stream) as plain calls;
    torch_ops_graph: the same captured and replayed; torch_ops_compile: it under
    torch.compile(fullgraph=True), captured and replayed. The torch peer
    (foxcute.peers.step): torch_compile (torch.compile's default mode) and torch_max_autotune
    (mode "max-autotune-no-cudagraphs"), each compiled by its first calls, then captured in
    one CUDA graph and timed as the cute step is; torch_eager as plain calls (as a PyTorch
    user runs it); torch_compile_cudagraphs (torch's own CUDA graphs, mode "reduce-overhead",
    plain calls: host time included; not in the default list). `reference`: step.run's
    reference outputs for these sizes and seed, if already computed."""
    from . import timing

    host = step.make_inputs(sizes, np.random.default_rng(seed))
    if reference is None:
        reference = step.run(host, backend="reference")
    device = step.to_device(host, "torch")
    records = []
    for name in impls:
        row = _record(name, sizes, precision)
        try:
            fn, graph = _step_function(name, device, precision, impl)
            outputs = fn()
            errors = step.chain_errors(outputs, host, reference)
            column = lambda name: {output: e[name] for output, e in errors.items()}  # noqa: E731
            row["worst_output"], row["rel_err"] = worst(column("rel_err per part"))
            row["elem_err_output"], row["elem_err"] = worst(column("elem_err per part"))
            row["rel_err_end_to_end_output"], row["rel_err_end_to_end"] = worst(column("rel_err end to end"))
            if graph:
                timing.check_graph_replay(lambda: list(fn().values()), library="torch")
            settings = (dict(warmup=0, reps=naive_reps, calls_per_rep=1) if name == "naive"
                        else dict(warmup=warmup, reps=reps, calls_per_rep=calls_per_rep))
            row["timing"] = GRAPH_REPLAY if graph else "plain calls"
            _, samples = timing.bench(fn, graph=graph, library="torch", **settings)
            row.update(timing.spread(samples))
        except Exception as exc:  # one implementation failing must not hide the others
            row["error"] = f"{type(exc).__name__}: {exc}"
        records.append(row)
    return records


def _step_function(name: str, device: dict[str, dict[str, Any]], precision: str,
                   impl: str) -> tuple[Callable[[], dict[str, Any]], bool]:
    """(zero-argument step function, whether timing.bench may capture it in a CUDA graph)."""
    if name in ("naive", "cute", "cute_one_stream"):
        backend = "naive" if name == "naive" else "cute"
        fn = step.kernel_step(device, backend=backend, precision=precision, impl=impl, lanes=name == "cute")
        return fn, backend == "cute"
    if name in _OPERATOR_STEPS:
        import torch

        from ..torch import step as operator_step

        run = torch.compile(operator_step.run, fullgraph=True) if name == "torch_ops_compile" else operator_step.run
        return (lambda: run(device, precision=precision, impl=impl)), name != "torch_ops"
    if name not in _TORCH_MODES:
        raise ValueError(f"foxcute.lab.breakdown: unknown step implementation {name!r}; known: "
                         f"naive, cute, cute_one_stream, {', '.join(_OPERATOR_STEPS)}, {', '.join(_TORCH_MODES)}")
    from ..peers.step import Step

    peer = Step(_TORCH_MODES[name], precision)
    return (lambda: peer(device)), name in _GRAPH_REPLAYED_TORCH
