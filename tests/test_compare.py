"""foxcute.lab.compare: its argument checks on any machine; an A/B of a tree against itself on
the GPU."""
from pathlib import Path

import pytest

from foxcute.lab import compare, provenance

ROOT = Path(__file__).resolve().parents[1]


def test_needs_two_trees(capsys):
    assert compare.main(["mamba2.backward", "--tree", str(ROOT)]) == 2
    assert "at least two --tree" in capsys.readouterr().err


def test_rejects_a_tree_without_foxcute(capsys, tmp_path):
    assert compare.main(["mamba2.backward", "--tree", str(ROOT), "--tree", str(tmp_path)]) == 2
    assert f"no foxcute package in {tmp_path}" in capsys.readouterr().err


def test_worker_rejects_an_unknown_case_before_touching_a_gpu():
    with pytest.raises(SystemExit, match="unknown case 'mamba2.sideways'"):
        compare.worker("mamba2.sideways", None, reps=1, check=True)


def test_worker_rejects_an_implementation_the_case_lacks():
    with pytest.raises(SystemExit, match="has no implementation 'cute_fused'"):
        compare.worker("kan.forward", "cute_fused", reps=1, check=True)


def test_says_so_without_a_gpu(capsys):
    if provenance.gpu_available():
        pytest.skip("a GPU is present")
    assert compare.main(["kan.forward", "--tree", str(ROOT), "--tree", str(ROOT)]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err


@pytest.mark.gpu
def test_a_tree_against_itself_is_bit_identical(capsys):
    assert compare.main(["column_sum.forward[N=3]", "--tree", str(ROOT), "--tree", str(ROOT),
                         "--rounds", "1", "--reps", "5"]) == 0
    out = capsys.readouterr().out
    assert out.count("bit-identical to the first tree True") == 2 and "repeatable True" in out, out
