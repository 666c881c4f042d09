"""foxcute: CuTe DSL kernels for the seven GPU hot spots of a DQN trading trainer.

Every layer module offers `backend="reference"` (float64 NumPy, the executable form of
docs/layers.md) and the GPU backends "cute" and "naive" (foxcute.BACKENDS). Importing foxcute loads no GPU
library; the CuTe DSL, cupy and torch are imported when a GPU backend is first used.
`foxcute.torch` (the torch extra, imported only when asked for) offers the layers as PyTorch
operators and modules.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._arrays import BackendError, FoxcuteInputError
from ._layer import BACKENDS
from .reduction import column_sum

__version__ = "0.1.0"

_LAZY_MODULES = ("mamba2", "q_denoise", "kan", "curiosity", "risk_budget", "reduction", "step", "lab")

__all__ = ["BACKENDS", "BackendError", "FoxcuteInputError", "column_sum", "__version__", *_LAZY_MODULES]


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'foxcute' has no attribute {name!r}")
