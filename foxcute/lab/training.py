"""The training run measured (04_training): the time of one whole learner step (forward,
backward, Adam) for each way of running it, and the run's records in the results schema.

`STEP_IMPLS`, each timed at the same sizes on a batch from the same replay:

- "torch_eager": the plain-PyTorch agent, eager; plain calls (host work included).
- "torch_compile": the same with its losses under torch.compile (each mode of `compile_modes`
  tried, the fastest kept and named in the record's params), the step then captured in one
  CUDA graph and its replays timed (torch.compile's own CUDA graphs are left out: the step is
  captured whole instead).
- "foxcute": foxcute's modules, eager; plain calls.
- "foxcute_graph": the same step captured in one CUDA graph, replays timed.

Timing is foxcute.lab.timing.bench (CUDA events, median of `reps` samples of `calls_per_rep`
calls), after timing.check_graph_replay for the captured ones. TF32 is allowed everywhere
(foxcute's kernels and torch's matmuls), the speed setting; the drift comparison
(foxcute.train.experiment) decides precision separately. A step's Adam update changes the
weights, so each implementation times a learner of its own, never a training run's.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from .. import step
from . import timing
from .breakdown import GRAPH_REPLAY

STEP_IMPLS = ("torch_eager", "torch_compile", "foxcute", "foxcute_graph")
LAYER = "train"  # the records' layer (runner.TRAIN_LAYER)


def record(impl: str, pass_: str, params: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A record of the training run in the results schema (time_us, floor_us and rel_err None
    unless given; a measured value that is not a time in "value", a reason not run in "skipped")."""
    return {"layer": LAYER, "impl": impl, "pass": pass_, "params": params, "time_us": None, "floor_us": None,
            "rel_err": None, **fields}


def step_params(sizes: step.StepSizes) -> dict[str, int]:
    return {k: getattr(sizes, k) for k in ("B", "K", "SH2", "D", "Q")}


def step_records(sizes: step.StepSizes, cfg, markets, impls: Sequence[str] = STEP_IMPLS, *,
                 compile_modes: Sequence[str] = ("default", "max-autotune-no-cudagraphs"), warmup: int = 3,
                 reps: int = 20, calls_per_rep: int = 5) -> list[dict[str, Any]]:
    """One "step" record per implementation of `impls` (CUDA only), time_us with its spread
    and "timing" ("CUDA graph replay" or "plain calls"); an implementation that fails is
    recorded with its "error"."""
    import torch

    from ..train import experiment

    unknown = [i for i in impls if i not in STEP_IMPLS]
    if unknown:
        raise ValueError(f"step_records: unknown impls {unknown}; known: {', '.join(STEP_IMPLS)}")
    records = []
    with experiment.torch_tf32(True):
        for impl in impls:
            setup = experiment.SETUPS["torch_fp32" if impl.startswith("torch") else "foxcute"]
            params = {**step_params(sizes), "precision": "tf32"}
            graph = impl in ("torch_compile", "foxcute_graph")
            try:
                best = None
                for mode in (compile_modes if impl == "torch_compile" else (None,)):
                    trainer = experiment.build(sizes, dataclasses.replace(cfg, steps=1), setup, "cuda", markets)
                    trainer.fill()
                    batch = trainer.batch()
                    if mode is not None:
                        trainer.learner.compile(mode)

                    def fn(learner=trainer.learner, batch=batch):
                        return learner.step(batch)

                    if graph:
                        timing.check_graph_replay(fn, library="torch")
                    _, samples = timing.bench(fn, graph=graph, warmup=warmup, reps=reps,
                                              calls_per_rep=calls_per_rep, library="torch")
                    found = timing.spread(samples)
                    if best is None or found["time_us"] < best[0]["time_us"]:
                        best = (found, mode)
                    del trainer, batch, fn
                    torch.cuda.empty_cache()
                found, mode = best
                records.append(record(impl, "step", {**params, **({"mode": mode} if mode else {})}, **found,
                                      timing=GRAPH_REPLAY if graph else "plain calls"))
            except Exception as exc:  # recorded, and the notebook fails on it after the others ran
                records.append(record(impl, "step", params, error=f"{type(exc).__name__}: {exc}"))
    return records

