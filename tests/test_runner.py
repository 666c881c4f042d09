"""The notebook runner: typed parameters, and each way a notebook can fail kept apart."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from foxcute.lab import runner


def write_notebook(folder: Path, name: str, *cells: str) -> Path:
    """A notebook whose first cell is the parameters cell and the rest are `cells`."""
    params = new_code_cell('seconds: float = 0.0  # sleep\nflag: bool = False  # a switch\n'
                           'count: int = 3  # a count\nlabel: str = "x"  # a name\n'
                           'output_dir: str = "."  # side files')
    params.metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=[params, *(new_code_cell(c) for c in cells)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture
def declared(tmp_path):
    return {"00_a": runner.declared_parameters(write_notebook(tmp_path, "00_a", "pass"))}


def test_param_values_parse_by_the_type_of_the_default(declared):
    parsed = runner.parse_overrides(["seconds=1.10", "flag=true", "count=7", "label=0e123456"], declared)
    assert parsed == {"seconds": 1.1, "flag": True, "count": 7, "label": "0e123456"}
    assert type(parsed["seconds"]) is float and type(parsed["count"]) is int
    assert runner.parse_overrides(["flag=0"], declared) == {"flag": False}


@pytest.mark.parametrize("pair, message", [
    ("sigma=1", "no selected notebook declares it"),
    ("count=1.5", "not a int"),
    ("flag=maybe", "not a bool"),
    ("count", "expected name=value"),
    ("output_dir=/x", "set by the runner"),
])
def test_bad_params_are_rejected_with_a_reason(declared, pair, message):
    with pytest.raises(runner.RunnerError, match=message):
        runner.parse_overrides([pair], declared)


def test_unknown_param_stops_the_run_before_anything_executes(tmp_path):
    nb_dir = tmp_path / "nb"
    nb_dir.mkdir()
    write_notebook(nb_dir, "00_a", "pass")
    with pytest.raises(runner.RunnerError, match="nonexistent"):
        runner.run(preset="cpu", param_pairs=["nonexistent=1"], out_dir=tmp_path / "runs", notebook_dir=nb_dir)
    assert not (tmp_path / "runs").exists()


def test_notebook_receives_only_the_parameters_it_declares(declared, tmp_path):
    params = runner.notebook_parameters(declared["00_a"], {"count": 5, "device": "cpu"}, {"label": "y"}, tmp_path)
    assert params == {"count": 5, "label": "y", "output_dir": str(tmp_path)}


def test_every_preset_entry_is_declared_by_some_notebook():
    declared = {}
    for nb in runner.notebooks():
        declared.update(runner.declared_parameters(nb))
    for name, preset in runner.PRESETS.items():
        unknown = set(preset) - set(declared)
        assert not unknown, f"preset {name} sets parameters no notebook declares: {unknown}"
        for key, value in preset.items():
            assert type(value) is type(declared[key]), f"preset {name}: {key} has the wrong type"


def test_failures_are_classified_and_partial_notebooks_kept(tmp_path):
    nb_dir = tmp_path / "nb"
    nb_dir.mkdir()
    write_notebook(nb_dir, "00_ok", "import json, pathlib\n"
                   "pathlib.Path(output_dir, 'results_00_ok.json').write_text(json.dumps({'records': ["
                   "{'layer': 'l', 'impl': 'i', 'pass': 'p', 'params': {'B': count}, 'time_us': 2.0, "
                   "'floor_us': 1.0, 'rel_err': 0.0}]}))")
    write_notebook(nb_dir, "01_raises", "done_before = True", "raise ValueError('boom')", "never = True")
    write_notebook(nb_dir, "02_sleeps", "import time\ntime.sleep(seconds)")
    write_notebook(nb_dir, "03_dies", "import os\nos._exit(1)")
    code, run_dir = runner.run(preset="cpu", param_pairs=["seconds=60", "count=9"], out_dir=tmp_path / "runs",
                               notebook_dir=nb_dir, cell_timeout_s=3, progress_bar=False)
    assert code != 0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    status = {nb["name"]: nb for nb in manifest["notebooks"]}
    assert [status[n]["status"] for n in ("00_ok", "01_raises", "02_sleeps", "03_dies")] == \
        ["ok", "failed", "timeout", "dead_kernel"]
    assert status["01_raises"]["error"]["ename"] == "ValueError"
    assert manifest["parameters"]["02_sleeps"]["seconds"] == 60.0

    partial = nbformat.read(run_dir / "01_raises.ipynb", as_version=4)
    failing = [c for c in partial.cells if c.get("execution_count") == status["01_raises"]["error"]["exec_count"]]
    assert len(failing) == 1 and "raise ValueError" in failing[0].source
    executed = [c for c in partial.cells if c.cell_type == "code" and c.get("execution_count")]
    assert any("done_before" in c.source for c in executed)
    assert not any("never" in c.source for c in executed)
    assert (run_dir / "02_sleeps.ipynb").exists() and (run_dir / "03_dies.ipynb").exists()

    results = json.loads((run_dir / "results.json").read_text())
    assert results["records"][0]["params"] == {"B": 9}
    summary = (run_dir / "summary.md").read_text()
    assert "| 01_raises" in summary or "[01_raises]" in summary
    assert "timeout" in summary and "dead_kernel" in summary
    assert "`--param seconds=60 --param count=9`: a reduced scope" in summary
    assert not (tmp_path / "runs" / "README.md").exists(), "a run leaves the tracked index to `foxcute index`"
    index = runner.write_index(tmp_path / "runs").read_text()
    assert f"[{run_dir.name}]({run_dir.name}/summary.md)" in index
    assert "| cpu, seconds=60, count=9 |" in index


def test_a_run_cut_off_from_outside_still_says_what_finished(tmp_path):
    """The runner writes its record before each notebook: killed (SIGKILL, as a time limit
    does) during the second notebook, the folder holds the first one's results, the second
    marked running, the third not run, and the run incomplete, which README's results skip."""
    import signal
    import subprocess
    import sys
    import time

    nb_dir = tmp_path / "nb"
    nb_dir.mkdir()
    write_notebook(nb_dir, "00_ok", "import json, pathlib\n"
                   "pathlib.Path(output_dir, 'results_00_ok.json').write_text(json.dumps({'records': ["
                   "{'layer': 'l', 'impl': 'i', 'pass': 'p', 'params': {}, 'time_us': 2.0}]}))")
    write_notebook(nb_dir, "01_sleeps", "import time\ntime.sleep(600)")
    write_notebook(nb_dir, "02_never", "pass")
    out = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from pathlib import Path; from foxcute.lab import runner; "
                             f"runner.run(preset='cpu', out_dir=Path({str(out)!r}), notebook_dir=Path({str(nb_dir)!r}), "
                             "progress_bar=False)"], cwd=Path(runner.__file__).parents[2])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            manifests = list(out.glob("*/manifest.json"))
            if manifests and '"01_sleeps",\n      "status": "running"' in manifests[0].read_text():
                break
            assert proc.poll() is None, "the runner stopped before the second notebook started"
            time.sleep(0.2)
        else:
            raise AssertionError("the second notebook never started")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    run_dir = manifests[0].parent
    manifest = json.loads(manifests[0].read_text())
    assert manifest["complete"] is False
    assert [(nb["name"], nb["status"]) for nb in manifest["notebooks"]] == [
        ("00_ok", "ok"), ("01_sleeps", "running"), ("02_never", "not run")]
    assert json.loads((run_dir / "results.json").read_text())["records"][0]["time_us"] == 2.0
    assert "**Incomplete**" in (run_dir / "summary.md").read_text()
    manifest["provenance"]["gpu"] = "NVIDIA H200"  # even a GPU run is not README's while incomplete
    manifests[0].write_text(json.dumps(manifest))
    assert runner.newest_gpu_run(out) is None
    manifest["complete"] = True
    manifest["provenance"]["param_overrides"] = ["torch_compile=false"]  # a reduced scope: not a headline
    manifests[0].write_text(json.dumps(manifest))
    assert runner.newest_gpu_run(out) is None
    manifest["provenance"]["param_overrides"] = []
    manifests[0].write_text(json.dumps(manifest))
    assert runner.newest_gpu_run(out) == run_dir


def test_a_resumed_run_reruns_what_did_not_finish_with_the_runs_own_parameters(tmp_path):
    """`foxcute run --resume RUN_DIR`: the notebooks not ok run again into the same folder
    with the run's preset and overrides; a notebook already ok, new parameters, or other
    sources are refused before anything runs."""
    nb_dir = tmp_path / "nb"
    nb_dir.mkdir()
    write_notebook(nb_dir, "00_ok", "import json, pathlib\n"
                   "pathlib.Path(output_dir, 'results_00_ok.json').write_text(json.dumps({'records': ["
                   "{'layer': 'a', 'impl': 'i', 'pass': 'p', 'params': {}, 'time_us': 1.0}]}))")
    write_notebook(nb_dir, "01_needs_go", "import json, pathlib\n"
                   "assert pathlib.Path(output_dir, 'go').exists(), 'not yet'\n"
                   "pathlib.Path(output_dir, 'results_01_needs_go.json').write_text(json.dumps({'records': ["
                   "{'layer': 'b', 'impl': 'i', 'pass': 'p', 'params': {'count': count}, 'time_us': 2.0}]}))")
    code, run_dir = runner.run(preset="cpu", param_pairs=["count=9"], out_dir=tmp_path / "runs",
                               notebook_dir=nb_dir, progress_bar=False)
    assert code != 0
    first = json.loads((run_dir / "manifest.json").read_text())
    assert [nb["status"] for nb in first["notebooks"]] == ["ok", "failed"] and first["complete"]

    with pytest.raises(runner.RunnerError, match="keeps its own preset and parameters"):
        runner.run(resume=run_dir, param_pairs=["count=3"], notebook_dir=nb_dir)
    with pytest.raises(runner.RunnerError, match="00_ok already finished ok"):
        runner.run(resume=run_dir, notebook_names=["00_ok"], notebook_dir=nb_dir)
    tampered = json.loads((run_dir / "manifest.json").read_text())
    tampered["provenance"]["source_sha256"] = "0" * 64
    other = tmp_path / "other"
    other.mkdir()
    (other / "manifest.json").write_text(json.dumps(tampered))
    with pytest.raises(runner.RunnerError, match="source_sha256"):
        runner.run(resume=other, notebook_dir=nb_dir)

    (run_dir / "go").touch()
    code, resumed_dir = runner.run(resume=run_dir, notebook_dir=nb_dir, progress_bar=False)
    assert code == 0 and resumed_dir == run_dir
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [nb["status"] for nb in manifest["notebooks"]] == ["ok", "ok"] and manifest["complete"]
    assert manifest["provenance"]["utc"] == first["provenance"]["utc"]
    assert len(manifest["provenance"]["resumed_utc"]) == 1
    records = json.loads((run_dir / "results.json").read_text())["records"]
    assert [(r["layer"], r["params"]) for r in records] == [("a", {}), ("b", {"count": 9})]


def test_run_folder_name_says_device_and_commit():
    prov = {"utc": "2026-11-29T12:00:00Z", "gpu": "NVIDIA H200", "git_commit": "0123456789abcdef", "git_dirty": True}
    assert runner.run_folder_name(prov) == "20261129T120000Z_nvidia-h200_01234567-dirty"
    assert runner.run_folder_name({**prov, "gpu": None, "git_commit": None, "git_dirty": None}) == \
        "20261129T120000Z_cpu_nocommit"


def test_unknown_notebook_and_preset_are_rejected():
    with pytest.raises(runner.RunnerError, match="no notebook"):
        runner.select_notebooks(["99_missing"])
    with pytest.raises(runner.RunnerError, match="unknown preset"):
        runner.resolve_preset("a100")


# ---- the timing helpers the profiling notebook relies on (GPU only)


@pytest.mark.gpu
def test_graph_timing_measures_a_captured_kernel_and_rejects_a_missed_capture():
    import cupy

    from foxcute.lab import timing

    x = cupy.arange(1 << 22, dtype=cupy.float32)

    def doubled():
        return x * 2  # launches on the current stream: the capturing one

    timing.check_graph_replay(doubled)
    median_us, samples = timing.bench(doubled, reps=7, calls_per_rep=3)
    assert len(samples) == 7 and 0 < median_us < 1e5

    elsewhere = cupy.cuda.Stream(non_blocking=True)

    def doubled_elsewhere():
        with elsewhere:  # not the capturing stream: the graph stays empty
            return x * 2

    with pytest.raises(AssertionError, match="not rewritten"):
        timing.check_graph_replay(doubled_elsewhere)


@pytest.mark.gpu
def test_copy_bandwidth_is_plausible():
    from foxcute.lab import timing

    assert 0.1 < timing.copy_bandwidth_TBps(1 << 28, reps=5) < 20  # TB/s: any real GPU lies here


@pytest.mark.gpu
def test_launch_floor_is_plausible():
    from foxcute.lab import timing

    assert 0.5 < timing.launch_floor_us(reps=5, calls_per_rep=3) < 100  # us: one graph replay, any real GPU


def test_floor_is_bytes_over_bandwidth():
    from foxcute.lab import timing

    assert timing.floor_us(4.25e6, 4.25) == pytest.approx(1.0)  # 4.25 MB at 4.25 TB/s
    assert timing.floor_us(2e6, 1.0) == pytest.approx(2.0)


def test_index_writes_the_newest_gpu_runs_headline_into_the_readme(tmp_path):
    def run_folder(name, gpu, records):
        folder = tmp_path / "runs" / name
        folder.mkdir(parents=True)
        prov = {"utc": name, "gpu": gpu, "git_commit": "abc123", "copy_bandwidth_TBps": 4.25}
        (folder / "manifest.json").write_text(json.dumps(
            {"preset": "h200", "notebooks": [{"name": "03_profiling", "status": "ok"}], "provenance": prov}))
        targets = [{"target": "column_sum N=3 cute <= 5 us", "measured": "4 us", "met": True}] if gpu else []
        (folder / "results.json").write_text(json.dumps({"provenance": prov, "records": records,
                                                         "targets": targets}))

    rec = lambda impl, t: {"layer": "column_sum", "pass": "forward", "impl": impl,  # noqa: E731
                           "params": {"N": 3, "variant": "N=3"}, "time_us": t, "floor_us": 2.0,
                           "timing": "CUDA graph replay"}
    gemm = {"layer": "gemm", "pass": "matmul", "impl": "cutlass_cpp", "params": {"variant": "seed projection"},
            "time_us": 30.0, "floor_us": 20.0}
    run_folder("2026a_gpu", "NVIDIA H200", [rec("naive", 900.0), rec("cute", 4.0), rec("torch_eager", 8.0), gemm,
                                            {**gemm, "impl": "cute", "time_us": 25.0}])
    run_folder("2026b_cpu", None, [])
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{runner.README_BEGIN}\nold\n{runner.README_END}\nrest\n")
    assert runner.update_readme(readme, tmp_path / "runs")
    text = readme.read_text()
    assert "old" not in text and text.startswith("intro\n") and text.endswith("rest\n")
    row = next(line for line in text.splitlines() if line.startswith("| column_sum forward (N=3)"))
    assert row.split("|")[1:-1] == [" column_sum forward (N=3) ", " 900 ", " 4 ", " - ", " 8 ", " 2 ", " 2 ", " 225 ",
                                    " 2 "]
    header = next(line for line in text.splitlines() if line.startswith("| layer pass"))
    assert header.split("|")[2:6] == [" naive ", " cute ", " cutlass_cpp ", " torch_eager "]
    row = next(line for line in text.splitlines() if line.startswith("| gemm matmul (seed projection)"))
    assert row.split("|")[1:-1] == [" gemm matmul (seed projection) ", " - ", " 25 ", " 30 ", " - ", " 20 ", " 1.25 ",
                                    " - ", " - "]
    assert "2026a_gpu" in text
    assert "| column_sum N=3 cute <= 5 us | 4 us | yes |" in text and "(1 of 1 met)" in text
    assert "Not every notebook" not in text


def test_the_headline_step_ratio_takes_the_fastest_graph_replayed_torch_record(tmp_path):
    # torch_eager and torch_compile_cudagraphs are faster or slower but timed as plain calls
    # (or not saying how): only graph replays are set against the graph-replayed cute step
    step = lambda impl, t, how: {"layer": "step", "pass": "step", "impl": impl, "params": {"B": 8192},  # noqa: E731
                                 "time_us": t, "floor_us": 135.0, **({"timing": how} if how else {})}
    records = [step("cute", 247.0, "CUDA graph replay"), step("cute_one_stream", 280.0, "CUDA graph replay"),
               step("torch_eager", 200.0, "plain calls"), step("torch_compile", 640.0, "CUDA graph replay"),
               step("torch_max_autotune", 550.0, "CUDA graph replay"),
               step("torch_compile_cudagraphs", 100.0, "plain calls"), step("torch_other", 90.0, None)]
    prov = {"gpu": "NVIDIA H200", "git_commit": "abc123", "copy_bandwidth_TBps": 4.25}
    (tmp_path / "manifest.json").write_text(json.dumps({"notebooks": [], "provenance": prov}))
    (tmp_path / "results.json").write_text(json.dumps({"provenance": prov, "records": records}))
    text = runner.headline_markdown(tmp_path)
    header = next(line for line in text.splitlines() if line.startswith("| layer pass"))
    assert "torch_compile_cudagraphs" not in header and " torch_max_autotune " in header
    row = next(line for line in text.splitlines() if line.startswith("| step step"))
    assert row.split("|")[-2] == f" {550 / 247:.3g} "
    assert (f"The step: cute 247 us against the fastest torch step timed the same way, captured in one CUDA "
            f"graph and replayed (torch_max_autotune, 550 us): {550 / 247:.3g}x.") in text
    assert "torch_compile_cudagraphs) is not in this table" in text


def test_the_headline_counts_a_floor_again_where_the_runs_count_is_not_todays(tmp_path):
    # a run that counted Mamba2 backward's bytes with one [B, SH2] array too many: the table,
    # the ratio and the floor target take today's count, the run's figures named beside them
    from foxcute.lab import benchmarks, timing

    sizes = {"B": 8192, "K": 8, "SH2": 256, "D": 16}
    today = timing.floor_us(benchmarks.record_bytes("mamba2", "backward", sizes), 4.0)
    old = today + timing.floor_us(4 * 8192 * 256, 4.0)
    records = [{"layer": "mamba2", "pass": "backward", "impl": impl, "params": sizes, "time_us": t, "floor_us": old,
                "timing": "CUDA graph replay"} for impl, t in (("cute_fused", 2.1 * today), ("cute_seed", 2.95 * old))]
    records.append({"layer": "kan", "pass": "forward", "impl": "cute", "params": {"B": 8192, "I": 32, "O": 32, "G": 8},
                    "time_us": 7.0, "floor_us": timing.floor_us(benchmarks.record_bytes(
                        "kan", "forward", {"B": 8192, "I": 32, "O": 32, "G": 8}), 4.0), "timing": "CUDA graph replay"})
    targets = [{"target": "mamba2.backward cute_seed / floor <= 3x", "measured": "2.95x", "met": True},
               {"target": "mamba2.backward cute_fused / floor <= 1.5x", "measured": f"{2.1 * today / old:.3g}x",
                "met": False},
               {"target": "kan.forward cute <= 10 us", "measured": "7 us", "met": True}]
    prov = {"gpu": "NVIDIA H200", "git_commit": "abc123", "copy_bandwidth_TBps": 4.0}
    (tmp_path / "manifest.json").write_text(json.dumps({"notebooks": [], "provenance": prov}))
    (tmp_path / "results.json").write_text(json.dumps({"provenance": prov, "records": records, "targets": targets}))
    text = runner.headline_markdown(tmp_path)
    row = next(line for line in text.splitlines() if line.startswith("| mamba2 backward")).split("|")
    assert row[-5:-3] == [f" {today:.3g} ", " 2.1 "]
    assert f"mamba2 backward {old:.3g} -> {today:.3g} us." in text and "kan forward" not in text.split("Floors")[1]
    assert f"| mamba2.backward cute_seed / floor <= 3x | {2.95 * old / today:.3g}x (the run's count: 2.95x) | no |" in text
    assert "| kan.forward cute <= 10 us | 7 us | yes |" in text and "(1 of 3 met)" in text


def test_the_headline_compares_no_torch_record_that_was_not_graph_replayed(tmp_path):
    records = [{"layer": "step", "pass": "step", "impl": i, "params": {}, "time_us": t, "floor_us": 1.0,
                "timing": "plain calls" if i.startswith("torch") else "CUDA graph replay"}
               for i, t in (("cute", 247.0), ("torch_eager", 4120.0))]
    prov = {"gpu": "NVIDIA H200", "git_commit": "abc123"}
    (tmp_path / "manifest.json").write_text(json.dumps({"notebooks": [], "provenance": prov}))
    (tmp_path / "results.json").write_text(json.dumps({"provenance": prov, "records": records}))
    text = runner.headline_markdown(tmp_path)
    assert next(line for line in text.splitlines() if line.startswith("| step step")).split("|")[-2] == " - "
    assert "The step: cute" not in text


def test_the_readme_headline_names_a_notebook_that_failed(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    prov = {"gpu": "NVIDIA H200", "git_commit": "abc123", "copy_bandwidth_TBps": 4.25}
    error = {"ename": "AssertionError", "evalue": "mamba2.backward default: dsigma 6.8e-03\nsecond line"}
    (folder / "manifest.json").write_text(json.dumps({"notebooks": [
        {"name": "02_correctness", "status": "failed", "error": error},
        {"name": "03_profiling", "status": "ok"}], "provenance": prov}))
    (folder / "results.json").write_text(json.dumps({"provenance": prov, "records": []}))
    text = runner.headline_markdown(folder)
    assert ("Not every notebook of that run passed: 02_correctness failed "
            "(AssertionError: mamba2.backward default: dsigma 6.8e-03).") in text


def test_summary_and_headline_report_the_launch_floor_and_fixed_costs(tmp_path):
    prov = {"utc": "u", "gpu": "NVIDIA H200", "git_commit": "abc123", "source_sha256": "f00d"}
    fixed = {"case": "kan.backward", "impl": "cute", "batch_1_us": 7.5, "batch": 8192, "batch_us": 10.1,
             "launch_floor_us": 2.9}
    (tmp_path / "results_03_profiling.json").write_text(json.dumps(
        {"provenance": {"copy_bandwidth_TBps": 4.25, "launch_floor_us": 2.9}, "records": [], "fixed_cost": [fixed]}))
    results = runner.merge_results(tmp_path, prov)
    assert results["fixed_cost"] == [fixed] and results["provenance"]["launch_floor_us"] == 2.9
    manifest = {"notebooks": [{"name": "03_profiling", "status": "ok", "seconds": 1.0}], "provenance": prov}
    text = runner.summary_markdown(tmp_path, manifest, results)
    assert "graph replay of one trivial kernel 2.9 us" in text
    assert "- UTC: u; commit: `abc123`; sources sha256 `f00d` (`foxcute check-run`)" in text
    assert "| kan.backward | cute | 7.5 | 8192 | 10.1 | 2.9 |" in text
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert "A graph replay of one trivial kernel took 2.9 us there." in runner.headline_markdown(tmp_path)


def test_cpu_summary_links_the_newest_gpu_run_and_shows_the_compile_report(tmp_path):
    gpu_run, cpu_run = tmp_path / "20261201T000000Z_nvidia-h200_abc", tmp_path / "20261202T000000Z_cpu_abc"
    for folder, gpu in ((gpu_run, "NVIDIA H200"), (cpu_run, None)):
        folder.mkdir()
        (folder / "manifest.json").write_text(json.dumps({"notebooks": [], "provenance": {"gpu": gpu}}))
    (cpu_run / "kernel_report.csv").write_text("module,kernel,ptxas_registers,spill_stores,note\n"
                                               "column_sum,column_sum_N3,32,0,\n")
    prov = {"utc": "u", "gpu": None, "git_commit": "abc"}
    results = {"provenance": prov, "records": [{"layer": "kan", "pass": "forward", "impl": "cute", "params": {},
                                                "time_us": 7.0, "time_us_p10": 6.5, "time_us_p90": 7.5,
                                                "floor_us": 0.5, "rel_err": 1e-4, "elem_err": 2e-4,
                                                "elem_err_output": "y"}], "checks": []}
    text = runner.summary_markdown(cpu_run, {"notebooks": []}, results)
    assert f"[{gpu_run.name}](../{gpu_run.name}/summary.md)" in text
    assert "| column_sum | column_sum_N3 | 32 | 0 |  |" in text
    assert "| 6.5..7.5 |" in text and "0.0002 (y)" in text


def test_training_records_get_lines_of_their_own_in_the_headline_and_the_summary(tmp_path):
    # 04_training's records (layer "train"): step times and held-out returns are not layer
    # passes; a value is shown as a value, a row not run as skipped
    params = {"B": 8192, "K": 8, "SH2": 256, "D": 16, "Q": 64, "precision": "tf32"}
    records = [{"layer": "train", "pass": "step", "impl": "foxcute_graph", "params": params, "time_us": 900.0,
                "floor_us": None, "rel_err": None, "timing": "CUDA graph replay"},
               {"layer": "train", "pass": "step", "impl": "torch_eager", "params": params, "time_us": 9000.0,
                "floor_us": None, "rel_err": None, "timing": "plain calls"},
               {"layer": "train", "pass": "eval_return", "impl": "foxcute", "params": {}, "time_us": None,
                "floor_us": None, "rel_err": None, "value": -1.25},
               {"layer": "train", "pass": "eval_return", "impl": "torch_tf32", "params": {}, "time_us": None,
                "floor_us": None, "rel_err": None, "value": None, "skipped": "no CUDA GPU"}]
    prov = {"utc": "u", "gpu": "NVIDIA H200", "git_commit": "abc123"}
    (tmp_path / "manifest.json").write_text(json.dumps({"notebooks": [], "provenance": prov}))
    (tmp_path / "results.json").write_text(json.dumps({"provenance": prov, "records": records}))
    text = runner.headline_markdown(tmp_path)
    assert "| train" not in text
    assert ("One whole training step of the DQN agent (04_training: forward, backward, Adam; B=8192, K=8, SH2=256, "
            "D=16, Q=64, precision=tf32): foxcute_graph 900 us (CUDA graph replay), torch_eager 9e+03 us "
            "(plain calls).") in text
    assert "percent): foxcute -1.25." in text
    summary = runner.summary_markdown(tmp_path, {"notebooks": []}, {"provenance": prov, "records": records,
                                                                    "checks": []})
    assert "| train | eval_return | foxcute |  | -1.25 |" in summary
    assert "| train | eval_return | torch_tf32 |  | skipped: no CUDA GPU |" in summary
    assert "| train | eval_return | torch_tf32 |  | - | - | - | - | skipped | - |" in summary


def test_the_readme_takes_its_training_lines_from_the_newest_run_of_04_when_that_is_another_run(tmp_path):
    # a whole run does not fit one session of the GPU machine: 00-03 and 04 may be two runs
    out = tmp_path / "runs"

    def run_folder(name, notebooks, records, complete=True):
        folder = out / name
        folder.mkdir(parents=True)
        prov = {"utc": name, "gpu": "NVIDIA H200", "git_commit": name * 3, "copy_bandwidth_TBps": 4.25}
        (folder / "manifest.json").write_text(json.dumps(
            {"complete": complete, "notebooks": [{"name": n, "status": "ok"} for n in notebooks], "provenance": prov}))
        (folder / "results.json").write_text(json.dumps({"provenance": prov, "records": records}))
        return folder

    cute = {"layer": "column_sum", "pass": "forward", "impl": "cute", "params": {}, "time_us": 4.0, "floor_us": 2.0}
    train = lambda impl, t: {"layer": "train", "pass": "step", "impl": impl,  # noqa: E731
                             "params": {"B": 8192}, "time_us": t, "timing": "CUDA graph replay"}
    run_folder("2026a", ["03_profiling", "04_training"], [cute, train("foxcute_graph", 900.0)])
    training = run_folder("2026b", ["04_training"], [train("foxcute_graph", 800.0)])
    profiling = run_folder("2026c", ["00_tour", "03_profiling"], [cute])
    run_folder("2026d", ["03_profiling"], [cute], complete=False)  # cut off: never the README's
    assert runner.readme_runs(out) == (profiling, training)
    readme = tmp_path / "README.md"
    readme.write_text(f"{runner.README_BEGIN}\n{runner.README_END}\n")
    assert runner.update_readme(readme, out)
    text = readme.read_text()
    assert "From run [2026c]" in text and "The training lines below come from run [2026b]" in text
    assert "foxcute_graph 800 us" in text and "900" not in text
    # where the newest run of 03 ran 04 too, its own training lines, and no second run named
    run_folder("2026e", ["03_profiling", "04_training"], [cute, train("foxcute_graph", 700.0)])
    assert runner.update_readme(readme, out)
    text = readme.read_text()
    assert "foxcute_graph 700 us" in text and "come from run" not in text
