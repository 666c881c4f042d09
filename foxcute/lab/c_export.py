"""The exported C library timed on the GPU beside the Python cute records (issue 33): `records`
exports the kernels (`foxcute export`, or reuses an export of the same sizes, precision and
sources), builds the C harness foxcute/export/c/foxcute_bench.c against it with
toolchain.compile_program (the system compiler, docs/export.md's link line), runs it, and
returns its times in the profiling notebook's schema.

The harness times each pass and the whole step as foxcute.lab.timing.bench times the Python
kernels: one call captured in a CUDA graph on a non-default stream, `calls_per_rep` replays
between two CUDA events, `reps` samples, after `warmup` plain calls and `warmup` replays; it
checks first that a replay rewrites the outputs (set to NaN before). Records: impl "c_export"
per pass (layer, pass and params as benchmarks.CASES' records: column_sum with its
"variant" N=<n>), "c_export_graph" for the step (layer and pass "step", params as
breakdown.step_records'). A failure (export, build, run, a pass missing from the output)
becomes records with "error" and no time: nothing is raised, so the notebook goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

from ..export import toolchain
from ..step import StepSizes
from . import timing
from .benchmarks import PASS_OF_FUNCTION

SOURCE = toolchain.HERE / "c" / "foxcute_bench.c"
PROGRAM = "foxcute_bench"
TIMING = "CUDA graph replay"
# the harness's graph names (foxcute.h's functions, and the step) -> (layer, pass) of the records
LAYER_PASS = {**PASS_OF_FUNCTION, "step": ("step", "step")}


def params(name: str, sizes: StepSizes, batch: int, precision: str, N: int | None = None) -> dict[str, Any]:
    """A record's params, as the Python records of the same pass name them: benchmarks.CASES'
    sizes at B = batch (column_sum: B, Q, N and the variant "N=<n>"), and for the step
    breakdown.step_records' (every StepSizes field, B = batch, and the precision). `batch` is
    not checked here (the harness refuses B < 1)."""
    return {"mamba2_forward": dict(B=batch, K=sizes.K, SH2=sizes.SH2, D=sizes.D),
            "mamba2_backward": dict(B=batch, K=sizes.K, SH2=sizes.SH2, D=sizes.D),
            "q_denoise_loss_and_grads": dict(B=batch, A=sizes.A_q, H=sizes.H_q),
            "column_sum": dict(B=batch, Q=sizes.Q, N=N, variant=f"N={N}"),
            "kan_forward": dict(B=batch, I=sizes.I_kan, O=sizes.O_kan, G=sizes.G_kan),
            "kan_backward": dict(B=batch, I=sizes.I_kan, O=sizes.O_kan, G=sizes.G_kan),
            "curiosity_forward_backward": dict(B=batch, F=sizes.F, A=sizes.A, H=sizes.H_c),
            "risk_budget_forward": dict(B=batch, SH2=sizes.SH2, I=sizes.I_risk, H=sizes.H_risk),
            "step": {**dataclasses.asdict(sizes), "B": batch, "precision": precision}}[name]


def expected(sizes: StepSizes) -> list[tuple[str, int | None]]:
    """(pass, N) of every graph the harness times, in its order: the IQN column sums at N = A
    and N = H_iqn (once where they are equal)."""
    sums = [("column_sum", n) for n in dict.fromkeys((sizes.A, sizes.H_iqn))]
    return [("mamba2_forward", None), ("curiosity_forward_backward", None), ("risk_budget_forward", None),
            ("q_denoise_loss_and_grads", None), *sums, ("kan_forward", None), ("kan_backward", None),
            ("mamba2_backward", None), ("step", None)]


def record(name: str, sizes: StepSizes, batch: int, precision: str, N: int | None = None) -> dict[str, Any]:
    """A record without a time, with the profiling notebook's keys: floor_us and rel_err None
    (the notebook takes the floor of the Python record of the same pass; the harness checks
    that its graphs ran, not their results, which tests/test_gpu_export.py compares with
    float64)."""
    layer, pass_ = LAYER_PASS[name]
    return {"layer": layer, "pass": pass_, "impl": "c_export_graph" if name == "step" else "c_export",
            "params": params(name, sizes, batch, precision, N), "precision": precision, "time_us": None,
            "floor_us": None, "rel_err": None, "timing": TIMING}


def parse(stdout: str, sizes: StepSizes, batch: int, precision: str, error: str | None = None) -> list[dict[str, Any]]:
    """Records from the harness's output (its JSON lines; other lines are ignored), one per
    expected graph, in the harness's order: the median and percentiles of its samples
    (timing.spread), or "error" where it printed none: `error` (why the run failed) or that it
    printed none; a run that failed after printing every graph puts `error` on the last."""
    samples: dict[tuple[str, int | None], list[float]] = {}
    for line in stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            samples[row["pass"], row.get("N")] = [float(x) for x in row["samples_us"]]
    records = []
    for name, N in expected(sizes):
        row = record(name, sizes, batch, precision, N)
        if samples.get((name, N)):
            row.update(timing.spread(samples[name, N]))
        else:
            row["error"] = error or f"{PROGRAM} printed no samples for it"
        records.append(row)
    if error and not any("error" in r for r in records):  # it failed after its last graph
        records[-1]["error"] = error
    return records


def _matches(folder: Path, sizes: StepSizes, precision: str) -> bool:
    """Whether `folder` holds an export of these sizes (B aside: not compiled in), precision
    and package sources (manifest.json's source_fingerprint)."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    compiled = {k: v for k, v in manifest.get("sizes", {}).items() if k != "B"}
    wanted = {k: v for k, v in dataclasses.asdict(sizes).items() if k != "B"}
    return (compiled == wanted and manifest.get("precision") == precision
            and manifest.get("source_fingerprint") == toolchain.source_fingerprint()
            and (folder / toolchain.LIBRARY).is_file())


def export(folder: Path, sizes: StepSizes, precision: str, timeout_s: float = 900) -> None:
    """`foxcute export` into `folder` in a process of its own (it loads the DSL runtime
    globally and compiles fifteen kernels), unless the folder holds a matching export."""
    if _matches(folder, sizes, precision):
        return
    spec = ",".join(f"{k}={v}" for k, v in dataclasses.asdict(sizes).items())
    done = subprocess.run([sys.executable, "-m", "foxcute", "export", "--out", str(folder), "--sizes", spec,
                           "--precision", precision], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode:
        raise toolchain.ExportError(f"foxcute export failed ({done.returncode}): {done.stderr.strip()[-2000:]}")


@contextlib.contextmanager
def _folder(out_dir: Path | str | None) -> Iterator[Path]:
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        yield Path(out_dir)
        return
    with tempfile.TemporaryDirectory(prefix="foxcute-c-export-") as tmp:
        yield Path(tmp)


def records(out_dir: Path | str | None, sizes: StepSizes = StepSizes(), batch: int | None = None, warmup: int = 5,
            reps: int = 50, calls_per_rep: int = 10, precision: str = "tf32",
            timeout_s: float = 600) -> list[dict[str, Any]]:
    """Export (into `out_dir`, reused where it holds a matching export; None: a temporary
    folder), build the harness there, run it at B = `batch` (sizes.B where None); the records
    of every pass and of the step (module docstring). Never raises for a failure of the
    export, the build or the run: those become records with "error"."""
    batch = sizes.B if batch is None else batch
    try:
        with _folder(out_dir) as folder:
            export(folder, sizes, precision)
            exe = folder / PROGRAM
            toolchain.compile_program(SOURCE, exe, folder)
            done = subprocess.run([str(exe), *map(str, (batch, sizes.Q, sizes.H_iqn, warmup, reps, calls_per_rep))],
                                  capture_output=True, text=True, timeout=timeout_s)
        error = None if done.returncode == 0 else f"{PROGRAM} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
        return parse(done.stdout, sizes, batch, precision, error)
    except Exception as exc:  # the notebook must go on: every record says what failed
        return parse("", sizes, batch, precision, f"{type(exc).__name__}: {exc}")


def counterparts(c_record: dict[str, Any]) -> tuple[str, ...]:
    """The impls of the Python records a C record is set beside: a pass's cute kernel (Mamba2:
    cute_fused, the design exported), the step's on one stream (cute_one_stream, as the C step
    runs) and on two lanes (cute, the Python step as shipped)."""
    if c_record["impl"] == "c_export_graph":
        return ("cute_one_stream", "cute")
    return ("cute_fused",) if c_record["layer"] == "mamba2" else ("cute",)


def beside(c_records: list[dict[str, Any]], python_records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per C record and counterpart: its time, the Python record's of the same layer,
    pass and params (None where there is none or it has no time), and their ratio."""
    rows = []
    for c in c_records:
        variant = c["params"].get("variant")
        name = f"{c['layer']}.{c['pass']}" + (f"[{variant}]" if variant else "")
        for impl in counterparts(c):
            match = next((r for r in python_records if r["impl"] == impl and r["layer"] == c["layer"]
                          and r["pass"] == c["pass"] and r["params"] == c["params"]), {})
            c_us, cute_us = c.get("time_us"), match.get("time_us")
            rows.append({"pass": name, "impl": c["impl"], "us": c_us, "cute impl": impl, "cute us": cute_us,
                         "ratio": c_us / cute_us if c_us and cute_us else None})
    return rows


def reading(rows: list[dict[str, Any]]) -> str:
    """One sentence on `beside`'s rows: the range of the ratios against the 1.05x target."""
    paired = [r for r in rows if r["ratio"] is not None]
    if not paired:
        return "No C time has a Python cute time beside it: see the records' errors."
    low, high = min(paired, key=lambda r: r["ratio"]), max(paired, key=lambda r: r["ratio"])
    over = [f"{r['pass']} / {r['cute impl']}" for r in paired if r["ratio"] > 1.05]
    return (f"C / cute runs from {low['ratio']:.3g}x ({low['pass']} / {low['cute impl']}) to {high['ratio']:.3g}x "
            f"({high['pass']} / {high['cute impl']}) over {len(paired)} pairs; "
            + (f"past the 1.05x target: {', '.join(over)}." if over else "every pair within the 1.05x target."))
