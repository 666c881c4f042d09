"""Startup cost on the GPU: the first whole step of a new process, imports excluded, with the
compile cache (foxcute.kernels._compile_cache) cold, warm or off. Issue 31: about 22 s of
compiles before the cache; the target is <= 2 s warm.

Each measurement is a fresh Python process: it imports foxcute, torch and every kernel
module, copies `step.make_inputs` to the GPU (the CUDA context starts there), then times
one `step.run(..., backend="cute")` to its synchronize: compiles or cache loads, the
kernels' first launches (CUDA module loads, the ticket pools) and the step itself. It also
counts the cute.compile calls, so a warm run shows whether everything came from the cache.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from typing import Any

from .. import step

_CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CHILD = r"""
import importlib, json, pkgutil, sys, time
import numpy as np
import torch
import cutlass.cute as cute
import foxcute.kernels
from foxcute import step
from foxcute.checks import to_numpy

for module in pkgutil.iter_modules(foxcute.kernels.__path__):  # imports are not timed
    importlib.import_module(f"foxcute.kernels.{module.name}")
sizes, precision, save_to = step.StepSizes(**json.loads(sys.argv[1])), sys.argv[2], sys.argv[3]
x = step.to_device(step.make_inputs(sizes, np.random.default_rng(0)))
torch.cuda.synchronize()
compiles = 0
compile_fn = cute.compile


def counting_compile(*args, **kwargs):
    global compiles
    compiles += 1
    return compile_fn(*args, **kwargs)


cute.compile = counting_compile
start = time.perf_counter()
out = step.run(x, backend="cute", precision=precision)
torch.cuda.synchronize()
seconds = time.perf_counter() - start
if save_to:
    np.savez(save_to, **{name: to_numpy(value) for name, value in out.items()})
print(json.dumps({"seconds": seconds, "compiles": compiles}))
"""


def first_step(cache_dir: str | None, sizes: step.StepSizes = step.StepSizes(), precision: str = "tf32",
               save_to: str | None = None, timeout_s: float = 1200) -> dict[str, Any]:
    """One new process's first cute step: {"seconds", "compiles"}. cache_dir: the compile
    cache folder it uses (FOXCUTE_CACHE_DIR), None for the cache off (FOXCUTE_CACHE=0).
    save_to: an .npz path that receives the step's outputs by name."""
    env = {k: v for k, v in os.environ.items() if k not in ("FOXCUTE_CACHE", "FOXCUTE_CACHE_DIR")}
    # this foxcute, not another one installed in the environment
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_CHECKOUT, env.get("PYTHONPATH")]))
    if cache_dir is None:
        env["FOXCUTE_CACHE"] = "0"
    else:
        env["FOXCUTE_CACHE_DIR"] = cache_dir
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(dataclasses.asdict(sizes)), precision,
                           save_to or ""], env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the first-step process failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def startup_seconds(sizes: step.StepSizes = step.StepSizes(), precision: str = "tf32") -> dict[str, Any]:
    """The first step of a new process with an empty compile cache (cold: it compiles and
    stores every kernel), then of a second one on that cache (warm: it loads them), in a
    temporary cache folder: {"cold_s", "warm_s", "cold_compiles", "warm_compiles"}."""
    with tempfile.TemporaryDirectory(prefix="foxcute-startup-") as folder:
        cold = first_step(folder, sizes, precision)
        warm = first_step(folder, sizes, precision)
    return {"cold_s": cold["seconds"], "warm_s": warm["seconds"], "cold_compiles": cold["compiles"],
            "warm_compiles": warm["compiles"]}
