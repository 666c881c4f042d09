"""Fills the torch inductor/Triton caches (and foxcute's kernel cache) with what 03_profiling
compiles, so that 03 itself runs on warm caches. Nothing is timed or kept. Run on the GPU
machine by orchestrate.sh, beside 00-02.
  warm.py layers IMPL [K/N]   every layer case (every N-th from K) through one of
                              benchmarks.impls() (torch_compile; another name is an error)
  warm.py step IMPL           the step through one impl
  warm.py sweep               the batch sweep's torch_compile_dynamic points
  warm.py train               04_training's torch_compile step at the trainer's sizes (both modes)"""
import sys
import time
import traceback

import numpy as np

from foxcute import step
from foxcute.lab import benchmarks, breakdown
from foxcute.lab.runner import PRESETS

B = PRESETS["h200"]["batch"]  # the batch 03 times at
what = sys.argv[1]
start = time.perf_counter()
rng = np.random.default_rng(0)
if what == "layers":
    name = sys.argv[2]
    known = [impl.name for impl in benchmarks.impls()]
    if name not in known:
        sys.exit(f"warm.py layers: {name!r} is not a layer impl here; known: {', '.join(known)}")
    k, n = (int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "0/1").split("/"))
    cases = (benchmarks.CASES + benchmarks.GEMM_CASES)[k::n]
    for case in cases:
        for impl in benchmarks.impls():
            if impl.name == name and impl.applies(case):
                t = time.perf_counter()
                try:
                    inputs = case.make(rng, case.scaled(B))
                    fn = impl.make(case, benchmarks.to_device(inputs, impl.library))
                    fn()
                    fn()
                    print(f"{case.name} {name}: {time.perf_counter() - t:.1f} s", flush=True)
                except Exception:
                    traceback.print_exc()
elif what == "step":
    rows = breakdown.step_records(step.StepSizes(B=B), impls=[sys.argv[2]], warmup=2, reps=1, calls_per_rep=1)
    print({k: rows[0].get(k) for k in ("impl", "time_us", "error")})
elif what == "sweep":
    cases = [c for c in benchmarks.CASES
             if c.name in ("mamba2.backward", "q_denoise.loss_and_grads", "curiosity.forward_backward")]
    impls = [i for i in benchmarks.sweep_impls() if i.name == "torch_compile_dynamic"]
    # the bandwidth only sets the rows' floor column, which nothing keeps here
    benchmarks.batch_sweep(cases, benchmarks.SWEEP_BATCHES, impls, 4.0,
                           warmup=1, reps=1, calls_per_rep=1)
elif what == "train":
    from foxcute.lab import training
    from foxcute.train import dqn, experiment

    preset = PRESETS["h200"]
    sizes = experiment.sizes_named(preset["sizes"])
    cfg = dqn.TrainConfig(steps=preset["steps"], n_envs=preset["n_envs"], seed=preset["seed"])
    markets = experiment.markets_for(sizes, cfg, eval_paths=preset["eval_paths"], eval_length=preset["eval_length"])
    rows = training.step_records(sizes, cfg, markets, ["torch_compile"], warmup=1, reps=1, calls_per_rep=1)
    print({k: rows[0].get(k) for k in ("impl", "time_us", "error")})
else:
    sys.exit(f"warm.py: unknown target {what!r}")
print(f"warm {sys.argv[1:]}: {time.perf_counter() - start:.0f} s", flush=True)
