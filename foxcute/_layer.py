"""What the layer modules share: the backends, the contract a kernel module declares, the
option checks every public function runs first, handing validated arrays to a kernel
module, and the float64 helpers of the references.

Backend "reference" (float64 NumPy) is every layer's. The GPU backends are "cute" (the
optimized kernels) and "naive" (the "before" kernels). Each layer module names its kernel
modules in its own `kernel_modules()`, an explicit import run on first use (importing a
kernel module loads the CuTe DSL, and `import foxcute` stays GPU-free); each kernel module
declares what it offers as `CONTRACT`, a `KernelContract`, and sizes it rejects in
`check_sizes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Mapping

import numpy as np

from ._arrays import Checker, check_backend, check_choice

PRECISIONS = ("tf32", "fp32")
GPU_BACKENDS = ("cute", "naive")
BACKENDS = ("reference", *GPU_BACKENDS)


@dataclass(frozen=True)
class KernelContract:
    """What one kernel module offers its layer, declared once as the module's `CONTRACT`.

    passes:   the module's pass functions, named as in the layer module (e.g. "forward",
              "backward"); each takes the validated arrays of that pass in the layer's order.
    options:  the keyword options every pass function takes, each with the values it accepts
              (the first is the default); the naive kernels take none.
    sized_by: the options that change which sizes the kernels take; `check_sizes(chk,
              **those)` raises FoxcuteInputError for sizes outside them, before any launch.
    """

    passes: tuple[str, ...]
    options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    sized_by: tuple[str, ...] = ()

    def take(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """The subset of `options` this module's pass functions take."""
        return {name: value for name, value in options.items() if name in self.options}

    def variants(self) -> list[dict[str, str]]:
        """Every combination of option values (one empty dict where there are no options)."""
        combos: list[dict[str, str]] = [{}]
        for name, values in self.options.items():
            combos = [{**combo, name: value} for combo in combos for value in values]
        return combos


def start(where: str, backend: str, precision: str) -> Checker:
    """Checks the backend and precision and returns the Checker for the call's arrays."""
    check_backend(where, backend, BACKENDS)
    check_choice(where, "precision", precision, PRECISIONS)
    return Checker(where, gpu=backend != "reference")


def kernel_module(kernel_modules: Callable[[], Mapping[str, ModuleType]], backend: str, chk: Checker,
                  **options: Any) -> tuple[ModuleType, dict]:
    """The GPU backend's module from the layer's `kernel_modules()`: lets it reject sizes it
    does not support (`check_sizes`, before any launch), and returns it with the options
    its CONTRACT says its pass functions take."""
    module = kernel_modules()[backend]
    contract: KernelContract = module.CONTRACT
    module.check_sizes(chk, **{name: options[name] for name in contract.sized_by})
    return module, contract.take(options)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function, accurate to rounding at both flat ends: with e = exp(-|x|), 1/(1+e)
    for x >= 0 and e/(1+e) below. (0.5*(1+tanh(x/2)) lost ~5e-4 relative at x = -30.)"""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0, e) / (1.0 + e)


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)
