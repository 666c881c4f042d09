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


def test_a_loaded_kernel_gives_the_compiled_ones_bits_at_the_same_host_cost(tmp_path, monkeypatch):
    """column_sum N=3 compiled, stored and loaded back in this process: the loaded kernel,
    called through column_sum's own launch code, gives the compiled one's bits, and a call
    costs the host about as much (the same class and call path: printed, 1.5x allowed)."""
    import time

    torch = pytest.importorskip("torch")
    from foxcute.kernels import _compile_cache, _cute, column_sum

    monkeypatch.delenv("FOXCUTE_CACHE", raising=False)
    monkeypatch.setenv("FOXCUTE_CACHE_DIR", str(tmp_path))
    compiled = _cute.compile_kernel(column_sum._config(3), *column_sum.compile_args())
    assert _compile_cache.store(column_sum.__name__, (3, False, False), compiled) is not None
    loaded = _compile_cache.load(column_sum.__name__, (3, False, False))
    assert loaded.load_from_binary and not compiled.load_from_binary
    G = torch.randn(100_003, 3, device="cuda")
    results, per_call = {}, {}
    for name, fn in (("compiled", compiled), ("loaded", loaded)):
        monkeypatch.setattr(column_sum, "_compile", lambda n, keep=False, dependent=False, fn=fn: fn)
        results[name] = column_sum.column_sum(G).cpu()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(2000):
            column_sum.column_sum(G)
        per_call[name] = (time.perf_counter() - start) / 2000
        torch.cuda.synchronize()
    print(f"\nhost time per column_sum call: compiled {per_call['compiled'] * 1e6:.1f} us, "
          f"loaded {per_call['loaded'] * 1e6:.1f} us")
    assert torch.equal(results["loaded"].view(torch.int32), results["compiled"].view(torch.int32))
    assert per_call["loaded"] <= 1.5 * per_call["compiled"]
