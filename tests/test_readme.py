"""README's CPU examples (the API in brief, PyTorch) run as written (so they cannot rot)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_cpu_example_runs(capsys):
    section = README.read_text().split("## API in brief", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'backend="cute"' not in code
    exec(compile(code, "README.md (API in brief)", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("(4, 256) (256, 16)") and printed[1].startswith("(4, 32)")


def test_readme_pytorch_example_runs_on_the_cpu(capsys):
    pytest.importorskip("torch", reason="the torch extra is not installed")
    section = README.read_text().split("## PyTorch", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md (PyTorch)", "exec"), {})
    assert capsys.readouterr().out.strip() == ("torch.Size([4, 64]) torch.Size([4]) torch.Size([64, 16]) "
                                               "torch.Size([4, 8, 64])")
