"""What the layer modules share: which backends are offered, the option checks every public
function runs first, handing validated arrays to a kernel module, and the float64 helpers
of the references.

Backend "reference" is always offered. A GPU backend is offered for a layer only when its
kernel module exists: "cute" -> foxcute.kernels.<layer>, "naive" -> foxcute.kernels.naive_<layer>.
Kernel modules are imported only when their backend is used (importing one loads the DSL).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType
from typing import Any

import numpy as np

from ._arrays import Checker, check_backend, check_choice

PRECISIONS = ("tf32", "fp32")
_KERNEL_MODULE = {"cute": "foxcute.kernels.{layer}", "naive": "foxcute.kernels.naive_{layer}"}


def offered_backends(layer: str) -> tuple[str, ...]:
    """("reference", then each GPU backend whose kernel module for `layer` exists)."""
    gpu = tuple(backend for backend, module in _KERNEL_MODULE.items()
                if importlib.util.find_spec(module.format(layer=layer)) is not None)
    return ("reference", *gpu)


def start(where: str, layer: str, backend: str, precision: str) -> Checker:
    """Checks the backend and precision and returns the Checker for the call's arrays."""
    check_backend(where, backend, offered_backends(layer))
    check_choice(where, "precision", precision, PRECISIONS)
    return Checker(where, gpu=backend != "reference")


def kernel_module(layer: str, backend: str, chk: Checker, **options: Any) -> tuple[ModuleType, dict]:
    """Imports the GPU backend's kernel module, lets it reject sizes it does not support
    (`check_sizes`, before any launch), and returns it with the keyword options its
    functions take: the cute kernels take `options` (precision, and impl for Mamba2); the
    naive ones take none (plain FFMA float32, one way only)."""
    module = importlib.import_module(_KERNEL_MODULE[backend].format(layer=layer))
    if backend == "naive":
        module.check_sizes(chk)
        return module, {}
    module.check_sizes(chk, **{k: v for k, v in options.items() if k != "precision"})
    return module, options


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function, accurate to rounding at both flat ends: with e = exp(-|x|), 1/(1+e)
    for x >= 0 and e/(1+e) below. (0.5*(1+tanh(x/2)) lost ~5e-4 relative at x = -30.)"""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)
