"""What every CuTe kernel's PTX must show, checked once for all kernel modules (CI, no GPU):
compiled for Hopper (sm_90a), no local memory (a register array indexed at run time, or a
spill the PTX already makes), and no float atomics (batch reductions are fixed-order). Each
module's own test file checks what is particular to it (MMA instructions, load widths, ...)."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

pytest.importorskip("cutlass")

import foxcute.kernels  # noqa: E402

MODULES = sorted(m.name for m in pkgutil.iter_modules(foxcute.kernels.__path__) if not m.name.startswith("_"))


def test_every_kernel_module_is_covered():
    assert {"column_sum", "mamba2", "gemm", "q_denoise", "kan", "curiosity", "risk_budget"} <= set(MODULES)
    assert {f"naive_{layer}" for layer in ("column_sum", "mamba2", "q_denoise", "kan", "curiosity",
                                           "risk_budget")} <= set(MODULES)


@pytest.mark.parametrize("module", MODULES)
def test_hopper_target_no_local_memory_no_float_atomics(module):
    compiled = importlib.import_module(f"foxcute.kernels.{module}").compiled_for_ci()
    assert compiled, module
    for name, fn in compiled.items():
        ptx = fn.__ptx__
        assert ".target sm_90a" in ptx, name
        assert not re.search(r"\b(ld|st)\.local", ptx), name
        assert not re.search(r"\b(atom|red)\.[\w.]*\.f(16|32|64)\b", ptx), name


def test_ptx_digests_name_every_kernel_of_the_modules_asked_for(capsys):
    """`foxcute ptx`: one SHA-256 per kernel of each module's compiled_for_ci(), so that two
    checkouts' outputs show which kernels a change touched."""
    import json

    from foxcute import cli

    assert cli.main(["ptx", "--module", "column_sum", "--module", "risk_budget"]) == 0
    digests = json.loads(capsys.readouterr().out)
    assert set(digests) == {f"{m}.{k}" for m in ("column_sum", "risk_budget")
                            for k in importlib.import_module(f"foxcute.kernels.{m}").compiled_for_ci()}
    assert all(re.fullmatch(r"[0-9a-f]{64}", d) for d in digests.values())
    assert len(set(digests.values())) == len(digests)  # distinct kernels, distinct code


def test_compile_report_compiles_modules_in_workers_and_keeps_module_order():
    """03_profiling's report: each module compiled in a spawned worker; the rows come back in
    the order asked for whatever order the workers finish in, a module that cannot compile
    gives one row saying why, and every module gets one progress line."""
    from foxcute.lab import benchmarks

    lines = []
    rows = benchmarks.compile_report(["risk_budget", "no_such_module", "naive_column_sum"], workers=2,
                                     progress=lines.append)
    kernels = {m: list(importlib.import_module(f"foxcute.kernels.{m}").compiled_for_ci())
               for m in ("risk_budget", "naive_column_sum")}
    assert [(r["module"], r["kernel"]) for r in rows] == (
        [("risk_budget", k) for k in kernels["risk_budget"]] + [("no_such_module", "-")]
        + [("naive_column_sum", k) for k in kernels["naive_column_sum"]])
    assert rows[len(kernels["risk_budget"])]["note"].startswith("compile failed: ModuleNotFoundError")
    compiled = [r for r in rows if not r["note"]]
    assert all(r["ptxas_registers"] > 0 and r["ld_st_local"] == 0 for r in compiled)
    assert len(lines) == 3 and sum("no_such_module" in line for line in lines) == 1
