"""The committed notebooks: clean sources, one typed parameters cell, and a full CPU run."""

from __future__ import annotations

import json
import sys

import nbformat
import pytest

from foxcute import cli
from foxcute.lab import provenance, runner

NOTEBOOKS = runner.notebooks()
RECORD_KEYS = {"layer", "impl", "pass", "params", "time_us", "floor_us", "rel_err"}


def test_the_five_notebooks_exist():
    assert [p.stem for p in NOTEBOOKS] == ["00_tour", "01_derivation", "02_correctness", "03_profiling", "04_training"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_source_is_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    # nbformat 4.5 wants an id on every cell: reading fills a missing one in (and warns on
    # every run), so the file itself is what is checked
    ids = [c.get("id") for c in json.loads(path.read_text())["cells"]]
    assert all(ids) and len(set(ids)) == len(ids), "every cell has its own id"
    assert nb.metadata["kernelspec"]["name"] == "python3"
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code_cells), "outputs committed"
    assert "%autoreload 2" in code_cells[0].source
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged parameters"
    declared = runner.declared_parameters(path)
    lines = [ln for ln in tagged[0].source.splitlines() if ln.strip()]
    assert len(lines) == len(declared), "every line of the parameters cell is a `name: type = value  # help`"
    assert all("  # " in ln for ln in lines), "every parameter has a help comment"
    assert declared.get("output_dir") == "."


def test_cli_rejects_unknown_param(capsys):
    assert cli.main(["run", "--preset", "cpu", "--param", "no_such_param=1"]) == 2
    assert "no_such_param" in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_preset_end_to_end(tmp_path):
    code, run_dir = runner.run(preset="cpu", out_dir=tmp_path, progress_bar=False)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert {nb["name"]: nb["status"] for nb in manifest["notebooks"]} == {p.stem: "ok" for p in NOTEBOOKS}
    assert code == 0
    results = json.loads((run_dir / "results.json").read_text())
    prov = results["provenance"]
    for key in ("utc", "git_commit", "source_sha256", "gpu", "driver", "cuda_driver_api", "copy_bandwidth_TBps",
                "packages"):
        assert key in prov
    assert manifest["provenance"]["source_sha256"] == prov["source_sha256"] == provenance.source_digest()
    assert prov["packages"]["numpy"] and prov["python"] == ".".join(map(str, sys.version_info[:3]))
    assert results["records"], "the CPU profiling writes reference timings"
    for record in results["records"]:
        assert RECORD_KEYS <= set(record)
    assert (run_dir / "summary.md").read_text().count("| ok |") == len(NOTEBOOKS)
    assert not (tmp_path / "README.md").exists()  # the index is `foxcute index`'s
    for path in NOTEBOOKS:  # interactive-only cells stay out of headless runs
        executed = nbformat.read(run_dir / path.name, as_version=4)
        skipped = [c for c in executed.cells if "skip-execution" in c.metadata.get("tags", [])]
        assert all(not c.get("outputs") and c.get("execution_count") is None for c in skipped), path.name
    tour = nbformat.read(run_dir / "00_tour.ipynb", as_version=4)
    assert any("skip-execution" in c.metadata.get("tags", []) for c in tour.cells)


def test_environment_offers_the_python3_kernel_the_notebooks_name():
    # `jupyter lab` from this environment (the one `make run` builds) runs the notebooks on
    # its own interpreter: kernelspec python3 ships with ipykernel inside the environment.
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.argv[0] in ("python", "python3", sys.executable)
    assert spec.resource_dir.startswith(sys.prefix)
    for path in NOTEBOOKS:
        assert nbformat.read(path, as_version=4).metadata["kernelspec"]["name"] == "python3", path.name
