"""The compile cache on the H200: a new process's first cute step, cold (compiles and stores
every kernel), warm (loads them all: no cute.compile call) and with the cache off, each in a
fresh process (foxcute.lab.startup); the loaded kernels' outputs equal the freshly compiled
ones' bit for bit. About a minute: two processes compile the whole step."""

from __future__ import annotations

import numpy as np
import pytest

from foxcute import step
from foxcute.lab import startup

pytestmark = pytest.mark.gpu

# Small but inside every cute kernel's range (as tests/test_gpu_step.py's SMALL).
SMALL = step.StepSizes(B=300, K=5, SH2=128, D=16, Q=3, A_q=12, H_q=24, A=3, H_c=64, I_risk=16,
                       H_risk=32, I_kan=16, O_kan=8, G_kan=8, H_iqn=40)


def test_a_warm_cache_loads_every_kernel_and_gives_the_same_bits(tmp_path):
    cache = str(tmp_path / "cache")
    cold = startup.first_step(cache, SMALL, save_to=str(tmp_path / "cold.npz"))
    warm = startup.first_step(cache, SMALL, save_to=str(tmp_path / "warm.npz"))
    off = startup.first_step(None, SMALL, save_to=str(tmp_path / "off.npz"))
    print(f"\nfirst cute step of a new process (imports excluded): cold {cold['seconds']:.2f} s "
          f"({cold['compiles']} compiles), warm {warm['seconds']:.2f} s ({warm['compiles']} compiles), "
          f"cache off {off['seconds']:.2f} s ({off['compiles']} compiles)")
    assert cold["compiles"] == off["compiles"] > 0
    assert warm["compiles"] == 0
    assert warm["seconds"] < cold["seconds"]
    results = {name: np.load(tmp_path / f"{name}.npz") for name in ("cold", "warm", "off")}
    assert set(results["warm"].files) == set(results["off"].files) == set(results["cold"].files)
    for output in results["off"].files:
        want = results["off"][output]
        for name in ("cold", "warm"):
            got = results[name][output]
            assert (got.dtype, got.shape, got.tobytes()) == (want.dtype, want.shape, want.tobytes()), (name, output)
