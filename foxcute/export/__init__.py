"""`foxcute export`: the CuTe DSL kernels of the layer passes compiled ahead of time for sm_90a
(no GPU needed) into a C library for the Rust trainer: foxcute.h (the C API), libfoxcute.a
(the kernels with their cubins, the launch code, the DSL runtime) and manifest.json (what was
compiled in, versions, source fingerprint). docs/export.md is the user's guide.

Room: `foxcute/export/` may import the layers and `foxcute.kernels` (it compiles them) and is
imported by the command line only.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .. import _layer
from .._arrays import FoxcuteInputError
from ..step import StepSizes
from . import passes
from .toolchain import ExportError, build

__all__ = ["ExportError", "export", "parse_sizes"]


def parse_sizes(text: str) -> StepSizes:
    """`trainer` (the step's defaults) or comma-separated overrides of them, `K=8,SH2=256`
    (the names of foxcute.step.StepSizes)."""
    if text == "trainer":
        return StepSizes()
    names = {f.name for f in dataclasses.fields(StepSizes)}
    overrides = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name.strip() not in names or not value.strip().isdigit():
            raise ExportError(f"--sizes: '{item}' is not NAME=INTEGER with NAME one of {sorted(names)}")
        overrides[name.strip()] = int(value)
    try:
        return StepSizes(**overrides)
    except ValueError as exc:
        raise ExportError(f"--sizes: {exc}") from exc


def export(out: Path, sizes: StepSizes, precision: str = "tf32") -> dict:
    """Export every pass in passes.PASSES at `sizes` into `out`; writes and returns the manifest.
    ExportError where a size is one the kernels do not take or a tool is missing."""
    if precision not in _layer.PRECISIONS:
        raise ExportError(f"--precision must be one of {_layer.PRECISIONS}, got {precision!r}")
    try:
        exported = [make(sizes, precision) for make in passes.PASSES]
    except FoxcuteInputError as exc:
        raise ExportError(str(exc)) from exc
    manifest = {"sizes": dataclasses.asdict(sizes), **build(Path(out), exported, precision)}
    (Path(out) / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest
