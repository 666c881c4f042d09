"""The rooms of the package and what each may import (README, Layout): every import in
foxcute/ resolved to the foxcute module it names, and checked against its room's rule."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "foxcute"


def room(module: str) -> str:
    if module in ("foxcute.cli", "foxcute.__main__"):
        return "lab"  # the command line is the harness's front door
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("kernels", "lab", "peers", "torch", "export", "train"):
        return parts[1]
    return "layers"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def foxcute_imports(path: Path) -> list[tuple[str, bool]]:
    """(imported foxcute module, at module level?) for each import in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        found += [(t, id(node) in top_level) for t in targets if t.split(".")[0] == "foxcute"]
    return found


# room -> rooms it may import at module level; lazily (inside a function) too
ALLOWED = {"layers": {"layers"}, "kernels": {"kernels"},
           "lab": {"layers", "kernels", "lab", "peers", "torch", "export", "train"},
           "peers": {"peers"}, "torch": {"layers", "torch"}, "export": {"layers", "kernels", "export"},
           "train": {"layers", "peers", "torch", "train"}}
SHARED = {"foxcute._arrays", "foxcute._layer", "foxcute.checks"}  # what the rooms share
LAZY = {"layers": {"kernels"}, "torch": {"kernels"}}  # a layer's kernel_modules(); an operator's kernels


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_room_imports_follow_the_layout(path):
    here = room(module_name(path))
    for target, top in foxcute_imports(path):
        if target in ("foxcute", *SHARED) or target.rsplit(".", 1)[0] in SHARED:
            continue
        allowed = ALLOWED[here] | (set() if top else LAZY.get(here, set()))
        assert room(target) in allowed, f"{module_name(path)} ({here}) imports {target} ({room(target)})"
