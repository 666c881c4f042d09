"""The source digest a run records, and the check of it against the run's recorded commit."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from foxcute import cli
from foxcute.lab import provenance

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def git(root, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path):
    files = {"pyproject.toml": "[project]\n", "foxcute/a.py": "A = 1\n", "foxcute/kernels/b.py": "B = 2\n",
             "notebooks/00.ipynb": "{}\n", "notebooks/sub/old.ipynb": "{}\n", "README.md": "r\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def head(root):
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()


def test_the_working_trees_digest_is_its_commits_until_a_source_file_changes(repo):
    commit = head(repo)
    assert provenance.source_digest(repo) == provenance.commit_source_digest(commit, repo)
    (repo / "README.md").write_text("other\n")  # not a source file
    (repo / "notebooks/sub/old.ipynb").write_text("[]\n")  # not run: only notebooks/*.ipynb are
    assert provenance.source_digest(repo) == provenance.commit_source_digest(commit, repo)
    (repo / "foxcute/kernels/b.py").write_text("B = 3\n")
    assert provenance.source_digest(repo) != provenance.commit_source_digest(commit, repo)


def test_an_untracked_module_changes_the_digest(repo):
    before = provenance.source_digest(repo)
    (repo / "foxcute/c.py").write_text("C = 1\n")
    assert provenance.source_digest(repo) != before


def test_check_run_passes_only_for_the_recorded_commits_sources(repo):
    first = head(repo)
    digest = provenance.source_digest(repo)
    (repo / "foxcute/a.py").write_text("A = 2\n")
    git(repo, "commit", "-q", "-am", "two")
    assert provenance.check_run({"git_commit": first, "source_sha256": digest}, repo) == \
        (True, f"the sources it ran are those of its recorded commit {first[:12]}")
    ok, found = provenance.check_run({"git_commit": head(repo), "source_sha256": digest}, repo)
    assert not ok and "not those of its recorded commit" in found
    assert provenance.check_run({"git_commit": first}, repo) == \
        (False, "cannot check: the run recorded no source digest")
    ok, found = provenance.check_run({"git_commit": "0" * 40, "source_sha256": digest}, repo)
    assert not ok and "is not readable" in found


def test_collect_records_the_digest_of_this_checkout():
    assert provenance.collect()["source_sha256"] == provenance.source_digest()


def test_check_run_command_exits_1_where_a_run_does_not_hold(tmp_path, capsys):
    run = tmp_path / "20261203T000000Z_nvidia-h200_0123abcd"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"provenance": {"git_commit": "0123abcd"}}))
    assert cli.main(["check-run", str(run)]) == 1
    assert capsys.readouterr().out == f"{run.name}: FAILED: cannot check: the run recorded no source digest\n"
