"""Shared test setup: the `gpu` marker skips, with the reason, where no CUDA GPU is usable."""

from __future__ import annotations

import functools
import os
import zlib

import numpy as np
import pytest

os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    try:
        import cupy
    except ImportError as exc:
        return f"cupy is not importable ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver: cupy raises CUDARuntimeError
        return f"no CUDA driver/GPU ({type(exc).__name__}: {exc})"
    if count == 0:
        return "no CUDA GPU present"
    major = cupy.cuda.Device(0).compute_capability[:1]
    if major != "9":
        return f"kernels target sm_90a; GPU 0 has compute capability {cupy.cuda.Device(0).compute_capability}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"gpu test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request):
    """A fresh generator per test, seeded from the test's name so a failure reproduces."""
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)

