"""Runs the notebooks with papermill into one run folder per call, and indexes the runs.

A run folder papermill_runs/<utc>_<gpu-or-cpu>_<commit>/ holds each executed notebook (kept,
partial, when it failed), the side files the notebooks wrote (results_<notebook>.json, CSV,
PNG), and what the runner makes of them:
  manifest.json  each notebook's status ("ok", how it failed, or "running" and "not run" in a
                 run cut off from outside) and seconds, whether the run is complete, the
                 parameters, the provenance; written before each notebook and at the end
  results.json   {"provenance": {...}, "records": [...]}: every notebook's records merged
  summary.md     a headline table of the records and the notebook statuses
`foxcute index` writes papermill_runs/README.md, an index of all run folders, and README's
results block from the newest complete GPU run.

Parameters are typed: a preset is a dict of Python values, and a `--param name=value` string
is parsed by the type of that parameter's default in the notebook (papermill's own -p guesses
types from the string alone, e.g. a hex commit can become a float).
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

from . import benchmarks, provenance, timing

REPO_ROOT = provenance.REPO_ROOT
NOTEBOOK_DIR = REPO_ROOT / "notebooks"
DEFAULT_OUT = REPO_ROOT / "papermill_runs"
DEFAULT_CELL_TIMEOUT_S = 1200

# Typed parameter values per preset. A notebook receives the entries it declares.
PRESETS: dict[str, dict[str, Any]] = {
    "cpu": {
        "device": "cpu",
        "backends": "reference",
        "seed": 0,
        "cpu_batch": 64,
        "compile_report": True,
        # 04_training: the plain-PyTorch agent at a tiny size for a few steps
        "sizes": "tiny",
        "steps": 30,
        "n_envs": 8,
        "eval_paths": 8,
        "eval_length": 48,
    },
    "h200": {
        "device": "gpu",
        "backends": "all",
        "seed": 0,
        "batch": 8192,
        "warmup": 5,
        "reps": 100,
        "repeats": 3,
        "compile_report": True,
        "sizes": "trainer",
        "steps": 1000,
        "n_envs": 256,
        "eval_paths": 64,
        "eval_length": 256,
    },
}

class RunnerError(ValueError):
    """A run was asked for with a notebook, preset or parameter that does not exist."""


def notebooks(notebook_dir: Path = NOTEBOOK_DIR) -> list[Path]:
    return sorted(notebook_dir.glob("[0-9][0-9]_*.ipynb"))


def resolve_preset(name: str) -> str:
    """"auto" is "h200" where a GPU is usable, else "cpu"."""
    if name == "auto":
        return "h200" if provenance.gpu_available() else "cpu"
    if name not in PRESETS:
        raise RunnerError(f"unknown preset {name!r}; choose from auto, {', '.join(PRESETS)}")
    return name


def select_notebooks(names: Sequence[str] | None, notebook_dir: Path = NOTEBOOK_DIR) -> list[Path]:
    available = notebooks(notebook_dir)
    if not names:
        return available
    by_name = {p.stem: p for p in available}
    chosen = []
    for name in names:
        stem = Path(name).stem
        if stem not in by_name:
            raise RunnerError(f"no notebook {name!r} in {notebook_dir}; available: {', '.join(by_name)}")
        chosen.append(by_name[stem])
    return chosen


def declared_parameters(notebook: Path) -> dict[str, Any]:
    """The notebook's `parameters` cell as {name: default value}, via papermill's parser."""
    import papermill

    inferred = papermill.inspect_notebook(str(notebook))
    return {name: ast.literal_eval(p["default"]) for name, p in inferred.items()}


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_value(name: str, text: str, default: Any) -> Any:
    """Parse `text` as the type of `default` (bool, int, float, str)."""
    try:
        if isinstance(default, bool):
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError("expected true/false")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, str):
            return text
    except ValueError as exc:
        raise RunnerError(f"--param {name}={text!r}: not a {type(default).__name__} ({exc})") from None
    raise RunnerError(f"--param {name}: parameter of type {type(default).__name__} cannot be set "
                      f"from the command line")


def parse_overrides(pairs: Sequence[str], declared: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """["name=value", ...] -> typed dict, checked against the notebooks' declared parameters
    ({notebook: {name: default}}). Unknown names are an error (papermill only warns)."""
    known: dict[str, Any] = {}
    for params in declared.values():
        for name, default in params.items():
            known.setdefault(name, default)
    out: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise RunnerError(f"--param {pair!r}: expected name=value")
        if name == "output_dir":
            raise RunnerError("--param output_dir: set by the runner (use --out)")
        if name not in known:
            raise RunnerError(f"--param {name}: no selected notebook declares it; known parameters: "
                              f"{', '.join(sorted(n for n in known if n != 'output_dir'))}")
        out[name] = parse_value(name, text, known[name])
    return out


def notebook_parameters(declared: dict[str, Any], preset: dict[str, Any], overrides: dict[str, Any],
                        output_dir: Path) -> dict[str, Any]:
    """What one notebook receives: the preset's and the overrides' entries it declares."""
    params = {k: v for k, v in preset.items() if k in declared}
    params.update({k: v for k, v in overrides.items() if k in declared})
    if "output_dir" in declared:
        params["output_dir"] = str(output_dir)
    return params


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def run_folder_name(prov: dict[str, Any]) -> str:
    stamp = prov["utc"].replace("-", "").replace(":", "")
    device = _slug(prov["gpu"]) if prov.get("gpu") else "cpu"
    commit = (prov.get("git_commit") or "nocommit")[:8]
    if prov.get("git_dirty"):
        commit += "-dirty"
    return f"{stamp}_{device}_{commit}"


@contextlib.contextmanager
def _kernel_environment() -> Iterator[None]:
    """The notebooks' kernels import this very foxcute and draw figures without a GUI."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "MPLBACKEND")}
    path = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    os.environ["MPLBACKEND"] = "Agg"
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def execute(notebook: Path, output: Path, params: dict[str, Any], *, cell_timeout_s: float | None,
            progress_bar: bool, cwd: Path) -> dict[str, Any]:
    """Run one notebook; return its manifest entry. The executed notebook is written to
    `output` whether it finished or not."""
    import papermill
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    entry: dict[str, Any] = {"name": notebook.stem, "status": "ok"}
    start = time.perf_counter()
    try:
        with _kernel_environment():
            papermill.execute_notebook(
                str(notebook), str(output), parameters=params, kernel_name="python3",
                language="python", cwd=str(cwd), execution_timeout=cell_timeout_s,
                progress_bar=progress_bar, log_output=not progress_bar)
    except papermill.PapermillExecutionError as exc:
        entry["status"] = "failed"
        # cell_index counts the cells as run (the injected-parameters cell included);
        # exec_count is the failing cell's execution count in the saved notebook.
        entry["error"] = {"cell_index": exc.cell_index, "exec_count": exc.exec_count,
                          "ename": exc.ename, "evalue": exc.evalue}
    except CellTimeoutError as exc:
        entry["status"] = "timeout"
        entry["error"] = {"ename": "CellTimeoutError", "evalue": str(exc).splitlines()[0],
                          "timeout_s": cell_timeout_s}
    except DeadKernelError as exc:
        entry["status"] = "dead_kernel"
        entry["error"] = {"ename": "DeadKernelError", "evalue": str(exc)}
    entry["seconds"] = round(time.perf_counter() - start, 2)
    return entry


def merge_results(run_dir: Path, prov: dict[str, Any]) -> dict[str, Any]:
    """results.json from the notebooks' results_*.json side files: their records, checks,
    targets and fixed-cost rows, in notebook order, under the run's provenance (plus any
    provenance fields a notebook measured, such as copy_bandwidth_TBps)."""
    merged_prov = dict(prov)
    merged_prov.setdefault("copy_bandwidth_TBps", None)
    merged: dict[str, list[dict[str, Any]]] = {key: [] for key in ("records", "checks", "targets", "fixed_cost")}
    for path in sorted(run_dir.glob("results_*.json")):
        part = json.loads(path.read_text())
        for key, rows in merged.items():
            rows.extend(part.get(key, []))
        merged_prov.update(part.get("provenance", {}))
    return {"provenance": merged_prov, **merged}


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def _targets_table(targets: list[dict[str, Any]], not_met: str) -> list[str]:
    """The issues' performance targets as measured (results' "targets"), a markdown table."""
    return ["| target | measured | met |", "|---|---|---|",
            *(f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else not_met} |" for t in targets)]


def summary_markdown(run_dir: Path, manifest: dict[str, Any], results: dict[str, Any]) -> str:
    """The run's summary.md: provenance, notebook statuses, records (median with the 10th-90th
    percentile spread, floor, errors), targets, fixed costs, the compile report where
    03_profiling wrote one (kernel_report.csv), checks; a run without a GPU links to the newest
    GPU run beside it, where the timings are."""
    prov = results["provenance"]
    lines = [f"# Run {run_dir.name}", ""]
    newest_gpu = None if prov.get("gpu") else newest_gpu_run(run_dir.parent)
    if newest_gpu is not None:
        lines += [f"No GPU in this run: the newest GPU run here is [{newest_gpu.name}]"
                  f"(../{newest_gpu.name}/summary.md).", ""]
    lines.append(f"- UTC: {prov['utc']}; commit: `{prov.get('git_commit')}`"
                 + (" (dirty)" if prov.get("git_dirty") else "")
                 + (f"; sources sha256 `{prov['source_sha256']}` (`foxcute check-run`)"
                    if prov.get("source_sha256") else ""))
    lines.append(f"- GPU: {prov.get('gpu') or 'none'}; driver {_fmt(prov.get('driver'))}; "
                 f"CUDA {_fmt(prov.get('cuda_driver_api'))}; copy bandwidth "
                 f"{_fmt(prov.get('copy_bandwidth_TBps'))} TB/s; graph replay of one trivial kernel "
                 f"{_fmt(prov.get('launch_floor_us'))} us")
    versions = ", ".join(f"{k} {v}" for k, v in prov.get("packages", {}).items() if v)
    lines.append(f"- Packages: {versions}")
    if prov.get("param_overrides"):
        lines.append(f"- Preset {manifest.get('preset')} with `--param {' --param '.join(prov['param_overrides'])}`: "
                     "a reduced scope, so this run is indexed but is not README's headline run")
    lines += ["", "## Notebooks", "",
              *([] if manifest.get("complete", True) else
                ["**Incomplete**: the run was cut off from outside (a time limit) while a notebook was "
                 "running; what is below is what had finished.", ""]),
              "| notebook | status | seconds | error |", "|---|---|---|---|"]
    for nb in manifest["notebooks"]:
        err = nb.get("error")
        err_text = f"{err.get('ename')} (cell {err['cell_index']})" if err and "cell_index" in err \
            else (err.get("ename") if err else "")
        lines.append(f"| [{nb['name']}]({nb['name']}.ipynb) | {nb['status']} | {nb.get('seconds', '-')} | {err_text} |")
    if results["records"]:
        lines += ["", "## Records", "",
                  "| layer | pass | impl | params | time_us | p10..p90 | floor_us | time/floor | rel_err | elem_err |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in results["records"]:
            ratio = r["time_us"] / r["floor_us"] if r.get("time_us") and r.get("floor_us") else None
            params = ", ".join(f"{k}={v}" for k, v in (r.get("params") or {}).items())
            err = (f"error: {r['error'].split(':')[0]}" if r.get("error") else
                   "skipped" if r.get("skipped") else _fmt(r.get("rel_err")))
            spread = f"{_fmt(r['time_us_p10'])}..{_fmt(r['time_us_p90'])}" if r.get("time_us_p10") is not None else "-"
            elem = _fmt(r.get("elem_err")) + (f" ({r['elem_err_output']})" if r.get("elem_err_output") else "")
            lines.append(f"| {r['layer']} | {r['pass']} | {r['impl']} | {params} | {_fmt(r.get('time_us'))} "
                         f"| {spread} | {_fmt(r.get('floor_us'))} | {_fmt(ratio)} | {err} | {elem} |")
    valued = [r for r in results["records"] if "value" in r]
    if valued:
        lines += ["", "## Values (records that measure something other than a time)", "",
                  "| layer | pass | impl | params | value |", "|---|---|---|---|---|",
                  *(f"| {r['layer']} | {r['pass']} | {r['impl']} | "
                    + ", ".join(f"{k}={v}" for k, v in (r.get("params") or {}).items())
                    + f" | {_fmt(r['value']) if not r.get('skipped') else 'skipped: ' + r['skipped']} |"
                    for r in valued)]
    targets = results.get("targets", [])
    if targets:
        lines += ["", "## Performance targets (measured, not asserted)", "",
                  f"{sum(t['met'] for t in targets)} of {len(targets)} met.", "", *_targets_table(targets, "NO")]
    fixed = results.get("fixed_cost", [])
    if fixed:
        lines += ["", "## Fixed cost (CuTe kernels at batch 1, graph-replayed)", "",
                  "| case | impl | batch 1 (us) | batch | at batch (us) | launch floor (us) |",
                  "|---|---|---|---|---|---|",
                  *(f"| {f['case']} | {f['impl']} | {_fmt(f['batch_1_us'])} | {f['batch']} "
                    f"| {_fmt(f.get('batch_us'))} | {_fmt(f.get('launch_floor_us'))} |" for f in fixed)]
    report = run_dir / "kernel_report.csv"
    if report.exists():
        import csv

        rows = list(csv.DictReader(report.open()))
        columns = [c for c in ("module", "kernel", "ptxas_registers", "spill_stores", "ld_global_128bit",
                               "mma_sync_tf32", "wgmma_tf32", "ld_st_local", "note") if rows and c in rows[0]]
        lines += ["", "## Compile report (every kernel compiled for sm_90a, kernel_report.csv)", "",
                  "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                  *("| " + " | ".join(row[c] for c in columns) + " |" for row in rows)]
    if results["checks"]:
        failed = [c for c in results["checks"] if not c.get("ok")]
        lines += ["", "## Checks", "", f"{len(results['checks'])} checks, {len(failed)} failed."]
        for c in failed:
            lines.append(f"- FAILED: {c.get('what')}: {c.get('detail', '')}")
    return "\n".join(lines) + "\n"


def write_index(out_dir: Path) -> Path:
    """papermill_runs/README.md: one line per run folder, newest first."""
    rows = []
    for manifest_path in sorted(out_dir.glob("*/manifest.json"), reverse=True):
        m = json.loads(manifest_path.read_text())
        prov = m["provenance"]
        statuses = ", ".join(f"{nb['name']}: {nb['status']}" for nb in m["notebooks"])
        commit = (prov.get("git_commit") or "-")[:12] + (" (dirty)" if prov.get("git_dirty") else "")
        run = manifest_path.parent.name
        preset = m.get("preset", "-") + "".join(f", {o}" for o in prov.get("param_overrides") or [])
        rows.append(f"| [{run}]({run}/summary.md) | {prov['utc']} | {prov.get('gpu') or 'cpu'} "
                    f"| `{commit}` | {preset} | {statuses} |")
    text = ["# papermill runs", "",
            "Generated by `foxcute run` after every run (do not edit by hand). Each folder holds the",
            "executed notebooks, `manifest.json`, `results.json` and `summary.md`. Runs that nothing",
            "in the repository cites any more are removed from the tree, as the GPU machine takes a",
            "bounded copy of it: `git log --diff-filter=D --stat -- papermill_runs` lists them, and",
            "`git show <commit>^:papermill_runs/<run>/summary.md` reads one.", "",
            "| run | UTC | GPU | commit | preset | notebooks |", "|---|---|---|---|---|---|", *rows]
    index = out_dir / "README.md"
    index.write_text("\n".join(text) + "\n")
    return index


README_BEGIN = "<!-- foxcute-results:begin (written by `foxcute index`) -->"
README_END = "<!-- foxcute-results:end -->"
# torch_compile_cudagraphs is left out: timed as plain calls, its time is mostly the host work of
# torch's graph replays behind each Python call, not comparable with a graph replay
HEADLINE_IMPLS = ("naive", "cute", "cute_one_stream", "cute_fused", "cute_seed", "cutlass_cpp", "torch_eager",
                  "torch_compile", "torch_max_autotune")
GRAPH_REPLAY = "CUDA graph replay"  # a record's "timing" (foxcute.lab.breakdown.GRAPH_REPLAY)
TRAIN_LAYER = "train"  # 04_training's records (foxcute.lab.training.LAYER): lines of their own, not a layer pass


def _graph_replayed_torch(times: dict[str, float | None], timings: dict[str, str | None]) -> tuple[str, float] | None:
    """(impl, time) of the fastest torch record whose "timing" says it was graph-replayed; None
    without one (records that do not say how they were timed are not compared)."""
    found = [(t, i) for i, t in times.items() if i.startswith("torch") and t and timings.get(i) == GRAPH_REPLAY]
    return (min(found)[1], min(found)[0]) if found else None


def headline_markdown(run_dir: Path, training_run: Path | None = None) -> str:
    """The README's results block from one run folder: per layer pass the time (us) of each
    implementation of HEADLINE_IMPLS, the memory floor, best CuTe time / floor, naive / best
    CuTe, and best torch / best CuTe, where best torch is the fastest torch record timed the
    way the CuTe kernels are (its "timing" GRAPH_REPLAY); then the step's headline ratio on
    that same footing, the training run's lines (04_training's records: from `training_run`
    where given and another run, which the lines then name, else from `run_dir`), and the
    targets."""
    results = json.loads((run_dir / "results.json").read_text())
    prov = results["provenance"]
    cases: dict[str, dict[str, Any]] = {}
    for r in results["records"]:
        if r["layer"] == TRAIN_LAYER:
            continue
        variant = (r.get("params") or {}).get("variant")
        name = f"{r['layer']} {r['pass']}" + (f" ({variant})" if variant else "")
        if name not in cases:
            cases[name] = {"floor": r.get("floor_us"), "times": {}, "timings": {},
                           "target_names": {f"{r['layer']}.{r['pass']}"} | ({f"{r['layer']} {variant}"} if variant else set())}
            recount = _floor_today(r, prov.get("copy_bandwidth_TBps"))
            if recount is not None and cases[name]["floor"] and abs(recount / cases[name]["floor"] - 1) > 1e-3:
                cases[name]["recorded_floor"], cases[name]["floor"] = cases[name]["floor"], recount
        case = cases[name]
        case["times"][r["impl"]] = r.get("time_us")
        case["timings"][r["impl"]] = r.get("timing")
    impls = [i for i in HEADLINE_IMPLS if any(i in c["times"] for c in cases.values())]
    lines = [f"From run [{run_dir.name}](papermill_runs/{run_dir.name}/summary.md): {prov.get('gpu')}, "
             f"commit `{(prov.get('git_commit') or '-')[:12]}`, copy ceiling "
             f"{_fmt(prov.get('copy_bandwidth_TBps'))} TB/s; times in microseconds (CUDA-graph replays "
             f"where the summary says so), batch as in its parameters."
             + (f" A graph replay of one trivial kernel took {_fmt(prov['launch_floor_us'])} us there."
                if prov.get("launch_floor_us") else ""), ""]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    not_ok = [f"{nb['name']} {nb['status']}"
              + (f" ({nb['error'].get('ename')}: {nb['error'].get('evalue', '').splitlines()[0]})"
                 if isinstance(nb.get("error"), dict) else "")
              for nb in manifest["notebooks"] if nb["status"] != "ok"]
    if not_ok:
        lines += [f"Not every notebook of that run passed: {'; '.join(not_ok)}.", ""]
    lines += ["| layer pass | " + " | ".join(impls) + " | floor | best cute / floor | naive / best cute "
              "| best torch (graph) / best cute |",
              "|---|" + "---|" * (len(impls) + 4)]
    step_line = None
    for name, case in cases.items():
        cute = [t for i, t in case["times"].items() if i.startswith("cute") and t]
        best = min(cute) if cute else None
        naive = case["times"].get("naive")
        torch = _graph_replayed_torch(case["times"], case["timings"])
        ratio = best / case["floor"] if best and case["floor"] else None
        speedup = naive / best if naive and best else None
        versus_torch = torch[1] / best if torch and best else None
        cells = [_fmt(case["times"].get(i)) for i in impls]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {_fmt(case['floor'])} | {_fmt(ratio)} "
                     f"| {_fmt(speedup)} | {_fmt(versus_torch)} |")
        if name == "step step" and versus_torch:
            step_line = (f"The step: cute {_fmt(best)} us against the fastest torch step timed the same way, "
                         f"captured in one CUDA graph and replayed ({torch[0]}, {_fmt(torch[1])} us): "
                         f"{_fmt(versus_torch)}x.")
    if step_line:
        lines += ["", step_line]
    recounted = {name: case for name, case in cases.items() if "recorded_floor" in case}
    if recounted:
        lines += ["", "Floors counted again with today's byte counts (foxcute.lab.benchmarks, docs/layers.md "
                      "section 9) at that run's copy ceiling, where the run's own count differs (the table and "
                      "the targets use today's): " + "; ".join(
                          f"{name} {_fmt(case['recorded_floor'])} -> {_fmt(case['floor'])} us"
                          for name, case in recounted.items()) + "."]
    train_records = results["records"]
    if training_run is not None and training_run != run_dir:
        train_records = json.loads((training_run / "results.json").read_text())["records"]
        train_prov = json.loads((training_run / "manifest.json").read_text())["provenance"]
        lines += ["", f"The training lines below come from run [{training_run.name}]"
                      f"(papermill_runs/{training_run.name}/summary.md): {train_prov.get('gpu')}, commit "
                      f"`{(train_prov.get('git_commit') or '-')[:12]}`."]
    train_steps = [r for r in train_records
                   if r["layer"] == TRAIN_LAYER and r["pass"] == "step" and r.get("time_us")]
    if train_steps:
        lines += ["", "One whole training step of the DQN agent (04_training: forward, backward, Adam; "
                      + ", ".join(f"{k}={v}" for k, v in train_steps[0]["params"].items() if k != "mode") + "): "
                      + ", ".join(f"{r['impl']} {_fmt(r['time_us'])} us ({r.get('timing', '-')})"
                                  for r in train_steps) + "."]
    returns = [r for r in train_records if r["layer"] == TRAIN_LAYER and r["pass"] == "eval_return"
               and r.get("value") is not None]
    if returns:
        lines += ["", "Held-out return of each training setup's final policy (mean total reward per path, "
                      "percent): " + ", ".join(f"{r['impl']} {_fmt(r['value'])}" for r in returns) + "."]
    lines += ["", "\"best torch (graph)\" takes only torch records replayed from a CUDA graph, as the CuTe "
                  "kernels are. torch.compile(mode=\"reduce-overhead\") (torch_compile_cudagraphs) is not in "
                  "this table: it replays torch's own CUDA graphs behind every Python call, so timed as plain "
                  "calls its time is mostly that host work, not the GPU's; summary.md lists it where a run "
                  "measured it."]
    targets = [_target_recounted(t, recounted) for t in results.get("targets", [])]
    if targets:
        lines += ["", f"The issues' performance targets, as measured in that run "
                      f"({sum(t['met'] for t in targets)} of {len(targets)} met):", "",
                  *_targets_table(targets, "no")]
    return "\n".join(lines) + "\n"


def _floor_today(record: dict[str, Any], bandwidth_TBps: float | None) -> float | None:
    """The record's memory floor (us) by today's byte count at the run's copy ceiling; None
    where the run measured no ceiling or no case describes the record."""
    count = benchmarks.record_bytes(record["layer"], record["pass"], record.get("params") or {})
    return timing.floor_us(count, bandwidth_TBps) if count is not None and bandwidth_TBps else None


_FLOOR_TARGET = re.compile(r"^(?P<case>.+) (?P<impl>\S+) / floor <= (?P<limit>[0-9.]+)x$")


def _target_recounted(target: dict[str, Any], recounted: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`target` as it stands where it is not a "<case> <impl> / floor <= Nx" target of a
    recounted case (headline_markdown's cases with a "recorded_floor"); else measured again
    against today's floor, the run's own figure named beside it."""
    match = _FLOOR_TARGET.match(target["target"])
    case = next((c for c in recounted.values() if match and match["case"] in c["target_names"]), None)
    time_us = case and case["times"].get(match["impl"])
    if not time_us:
        return target
    ratio = time_us / case["floor"]
    return {"target": target["target"], "measured": f"{ratio:.3g}x (the run's count: {target['measured']})",
            "met": ratio <= float(match["limit"])}


def newest_gpu_run(out_dir: Path, notebook: str | None = None) -> Path | None:
    """The newest complete GPU run folder under `out_dir` (by name: its UTC start) that ran its
    preset as it stands (a run with --param overrides, e.g. one that leaves out the torch.compile
    peers to fit a short GPU session, is kept and indexed but is nobody's headline); with
    `notebook`, the newest of those that ran it."""
    runs = [m.parent for m in sorted(out_dir.glob("*/manifest.json"))
            if (manifest := json.loads(m.read_text()))["provenance"].get("gpu") and manifest.get("complete", True)
            and not manifest["provenance"].get("param_overrides")
            and (notebook is None or any(nb["name"] == notebook for nb in manifest["notebooks"]))]
    return runs[-1] if runs else None


def readme_runs(out_dir: Path) -> tuple[Path | None, Path | None]:
    """(the run of README's kernel and step tables, the run of its training lines): the newest
    complete GPU runs that ran 03_profiling and 04_training (the newest GPU run of any kind
    where none ran 03_profiling). A whole run is longer than one session of the GPU machine
    allows, so the two may be separate runs."""
    return (newest_gpu_run(out_dir, "03_profiling") or newest_gpu_run(out_dir),
            newest_gpu_run(out_dir, "04_training"))


def update_readme(readme: Path, out_dir: Path) -> bool:
    """Replace the README's results block with the headline of readme_runs' folders.
    Returns False (README untouched) when there is no GPU run or no block."""
    run_dir, training_run = readme_runs(out_dir)
    text = readme.read_text()
    if run_dir is None or README_BEGIN not in text or README_END not in text:
        return False
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    readme.write_text(f"{head}{README_BEGIN}\n{headline_markdown(run_dir, training_run)}{README_END}{tail}")
    return True


def write_run_record(run_dir: Path, preset_name: str, entries: list[dict[str, Any]],
                     parameters: dict[str, dict[str, Any]], prov: dict[str, Any], *, complete: bool) -> None:
    """manifest.json, results.json and summary.md of the run so far. Written before each
    notebook starts and once more at the end, so a run cut off from outside (a time limit's
    SIGKILL) still says what finished, what was running and what never ran, with its
    provenance; `complete` is False until the last notebook has returned, and `foxcute
    index` takes only complete runs for README's results."""
    results = merge_results(run_dir, prov)
    manifest = {"preset": preset_name, "complete": complete, "notebooks": entries, "parameters": parameters,
                "provenance": results["provenance"]}
    # the manifest goes last and each file is replaced whole: whoever reads a manifest that
    # names a notebook "running" finds the results of every notebook before it
    _replace_text(run_dir / "results.json", json.dumps(
        {"provenance": results["provenance"], "records": results["records"],
         "targets": results["targets"]}, indent=2) + "\n")
    _replace_text(run_dir / "summary.md", summary_markdown(run_dir, manifest, results))
    _replace_text(run_dir / "manifest.json", json.dumps(manifest, indent=2) + "\n")


def _replace_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a sibling temporary file and os.replace, so a reader
    (or a SIGKILL) sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _resumed(run_dir: Path, preset: str, notebook_names: Sequence[str] | None, param_pairs: Sequence[str],
             notebook_dir: Path, prov: dict[str, Any]) -> tuple:
    """What `run(resume=run_dir)` continues: (run_dir, preset, the notebooks to run, the
    run's parameter overrides, its manifest entries and parameters, its provenance with this
    resumption added). RunnerError where the folder is not an incomplete run of these sources
    on this GPU, or where a preset or parameters are asked for (the run's own apply)."""
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.exists():
        raise RunnerError(f"cannot resume {run_dir}: it holds no manifest.json")
    manifest = json.loads(manifest_path.read_text())
    if preset != "auto" or param_pairs:
        raise RunnerError("a resumed run keeps its own preset and parameters: leave --preset and --param out")
    recorded = manifest["provenance"]
    differ = [key for key in RESUME_MUST_MATCH if recorded.get(key) != prov.get(key)]
    if differ:
        raise RunnerError(f"cannot resume {run_dir.name}: this checkout or machine differs from the run's in "
                          + ", ".join(f"{k} ({prov.get(k)!r}, the run's {recorded.get(k)!r})" for k in differ))
    pending = [e["name"] for e in manifest["notebooks"] if e["status"] != "ok"]
    wanted = [Path(n).stem for n in notebook_names] if notebook_names else pending
    done = [n for n in wanted if n not in pending]
    if done:
        raise RunnerError(f"{', '.join(done)} already finished ok in {run_dir.name} (or are not in it); "
                          f"left to run: {', '.join(pending) or 'nothing'}")
    recorded["resumed_utc"] = [*recorded.get("resumed_utc", []), prov["utc"]]
    return (run_dir, manifest["preset"], select_notebooks(wanted, notebook_dir), recorded.get("param_overrides", []),
            manifest["notebooks"], manifest["parameters"], recorded)


def _log(message: str) -> None:
    print(f"[foxcute run] {message}", file=sys.stderr, flush=True)


# what a resumed run must share with the run it continues: the same sources on the same GPU
RESUME_MUST_MATCH = ("git_commit", "git_dirty", "source_sha256", "gpu", "driver")


def run(*, preset: str = "auto", notebook_names: Sequence[str] | None = None,
        param_pairs: Sequence[str] = (), out_dir: Path | str = DEFAULT_OUT,
        cell_timeout_s: float | None = DEFAULT_CELL_TIMEOUT_S, notebook_dir: Path = NOTEBOOK_DIR,
        progress_bar: bool | None = None, resume: Path | str | None = None) -> tuple[int, Path]:
    """Run the notebooks; return (exit code: 0 when every notebook finished "ok", run folder).

    resume: an incomplete run folder to finish instead of starting a new one (a run longer
    than one call of a machine with a time limit): its notebooks that are not "ok" run again,
    with its preset and parameter overrides (`preset` and `param_pairs` must be left at their
    defaults), into the same folder; the sources and the GPU must be the run's
    (RESUME_MUST_MATCH), and the run's provenance keeps its start and lists each resumption."""
    prov = provenance.collect()
    if resume is not None:
        run_dir, preset_name, selected, param_pairs, entries, parameters, prov = _resumed(
            Path(resume), preset, notebook_names, param_pairs, notebook_dir, prov)
    else:
        preset_name = resolve_preset(preset)
        selected = select_notebooks(notebook_names, notebook_dir)
    if not selected:
        raise RunnerError(f"no notebooks found in {notebook_dir}")
    declared = {nb.stem: declared_parameters(nb) for nb in selected}
    overrides = parse_overrides(param_pairs, declared)
    if progress_bar is None:
        progress_bar = sys.stderr.isatty()

    if resume is None:
        prov["param_overrides"] = list(param_pairs)  # a resumption reuses them
        out_dir = Path(out_dir).resolve()
        run_dir = out_dir / run_folder_name(prov)
        for n in range(2, 100):  # two runs within one second get distinct folders
            if not run_dir.exists():
                break
            run_dir = out_dir / f"{run_folder_name(prov)}_{n}"
        run_dir.mkdir(parents=True)
        entries = [{"name": nb.stem, "status": "not run"} for nb in selected]
        parameters: dict[str, dict[str, Any]] = {}
    _log(f"preset {preset_name}; {len(selected)} notebook(s) -> {run_dir}")

    for nb in selected:
        i = next(n for n, e in enumerate(entries) if e["name"] == nb.stem)
        params = notebook_parameters(declared[nb.stem], PRESETS[preset_name], overrides, run_dir)
        parameters[nb.stem] = params
        entries[i] = {"name": nb.stem, "status": "running"}
        write_run_record(run_dir, preset_name, entries, parameters, prov, complete=False)
        _log(f"{nb.stem}: running")
        entry = execute(nb, run_dir / nb.name, params, cell_timeout_s=cell_timeout_s,
                        progress_bar=progress_bar, cwd=run_dir)
        entries[i] = entry
        detail = f" ({entry['error']['ename']}: {entry['error'].get('evalue', '')})" if "error" in entry else ""
        _log(f"{nb.stem}: {entry['status']} in {entry['seconds']} s{detail}")
    write_run_record(run_dir, preset_name, entries, parameters, prov,
                     complete=all(e["status"] not in ("running", "not run") for e in entries))
    # the index (papermill_runs/README.md) and README's results block are tracked files: a run
    # leaves them alone, so the next run's commit is not "-dirty" with identical sources
    failed = [e["name"] for e in entries if e["status"] != "ok"]
    _log(f"summary: {run_dir / 'summary.md'}" + (f"; NOT ok: {', '.join(failed)}" if failed else "; all ok"))
    _log("`foxcute index` lists the run in papermill_runs/README.md (and a GPU run in README's results)")
    return (1 if failed else 0), run_dir
