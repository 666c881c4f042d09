"""README's first API example runs as written on a CPU (so it cannot rot)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_cpu_example_runs(capsys):
    section = README.read_text().split("## API in brief", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert 'backend="cute"' not in code
    exec(compile(code, "README.md (API in brief)", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("(4, 256) (256, 16)") and printed[1].startswith("(4, 32)")
