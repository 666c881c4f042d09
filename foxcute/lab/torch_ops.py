"""What calling a layer pass through its PyTorch operator (foxcute.torch.ops) costs the host,
beside calling foxcute's public function directly: the operator adds torch's dispatcher, the
custom_op wrapper and its output checks (and, for the risk head, the device-side b2 shift).

The time is the host's alone: each call is timed with time.perf_counter and nothing
synchronizes between calls, so what is measured is how long the Python thread is busy
enqueuing the pass (validation, compile-cache lookup, allocations, launches), not the GPU's
time (lab.timing measures that, from CUDA graphs). Kernels are compiled and the caching
allocator warmed by `warmup` calls first. Too many calls in a row fill the device's launch
queue and then block the host; the median over the calls is robust to a few of those.

    python -m foxcute.lab.torch_ops            # the trainer's sizes, a table in microseconds
    python -m foxcute.lab.torch_ops --profile curiosity_forward_backward [...|all]
                                               # where a pass's host time goes (cProfile)
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import io
import pstats
import statistics
import time
from typing import Any, Callable

import numpy as np

from .. import curiosity, kan, mamba2, q_denoise, reduction, risk_budget, step
from .benchmarks import PASS_OF_FUNCTION


HOST_TIMING = "host time per call (time.perf_counter, median, no synchronization between calls)"


def median_host_us(fn: Callable[[], Any], calls: int, warmup: int) -> float:
    """Median microseconds the host spends in one call of fn, over `calls` calls made after
    `warmup` (the device is synchronized before the first timed call, not between them)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


def passes(sizes: step.StepSizes, precision: str = "tf32", impl: str = "fused") -> dict[str, tuple[Callable, Callable]]:
    """{operator name: (operator call, public function call)} on the same CUDA tensors, step
    inputs at `sizes` (the risk head's b2 a one-element tensor for the operator)."""
    import torch

    from ..torch import ops

    x = step.to_device(step.make_inputs(sizes, np.random.default_rng(0)))
    m, c, rb, qd, k = x["mamba2"], x["curiosity"], x["risk_budget"], x["q_denoise"], x["kan"]
    weights = (m["h_hist"], m["h"], m["W_A"], m["W_B"], m["W_C"], m["w"])
    dout = x["mamba2_backward"]["dout"]
    s = torch.randn(sizes.B, sizes.F, device="cuda")
    e = torch.rand(sizes.B, device="cuda")
    b2 = ops.risk_b2(rb["b2"], s)
    cur = (s, c["a"], c["s_next"], c["W1"], c["b1"], c["W2"], c["b2"])
    risk = (s, rb["isv"], e, rb["W1"], rb["b1"], rb["w2"])
    quad = (qd["q"], qd["q_target"], qd["W1"], qd["b1"], qd["W2"], qd["b2"])
    options = dict(backend="cute", precision=precision)
    return {
        "mamba2_forward": (lambda: ops.mamba2_forward(*weights, m["sigma"], impl, precision),
                           lambda: mamba2.forward(*weights, m["sigma"], impl=impl, **options)),
        "mamba2_backward": (lambda: ops.mamba2_backward(dout, *weights, m["sigma"], impl, precision),
                            lambda: mamba2.backward(dout, *weights, m["sigma"], impl=impl, **options)),
        "q_denoise_loss_and_grads": (lambda: ops.q_denoise_loss_and_grads(*quad, precision),
                                     lambda: q_denoise.loss_and_grads(*quad, **options)),
        "column_sum": (lambda: ops.column_sum(x["iqn"]["head_grad"]),
                       lambda: reduction.column_sum(x["iqn"]["head_grad"], backend="cute")),
        "kan_forward": (lambda: ops.kan_forward(k["x"], k["C"], k["Wb"], precision),
                        lambda: kan.forward(k["x"], k["C"], k["Wb"], **options)),
        "kan_backward": (lambda: ops.kan_backward(k["dy"], k["x"], k["C"], k["Wb"], precision),
                         lambda: kan.backward(k["dy"], k["x"], k["C"], k["Wb"], **options)),
        # the public function with check_actions=False, as the operator calls it on CUDA
        "curiosity_forward_backward": (lambda: ops.curiosity_forward_backward(*cur, precision),
                                       lambda: curiosity.forward_backward(*cur, check_actions=False, **options)),
        "risk_budget_forward": (lambda: ops.risk_budget_forward(*risk, b2, precision),
                                lambda: risk_budget.forward(*risk, rb["b2"], **options)),
    }


def host_costs(sizes: step.StepSizes = step.StepSizes(), calls: int = 200, warmup: int = 20,
               precision: str = "tf32", impl: str = "fused") -> dict[str, dict[str, float]]:
    """{operator name: {"operator_us", "function_us"}}: median host microseconds of one call
    through the operator and through foxcute's public function, on a CUDA GPU."""
    return {name: {"operator_us": median_host_us(op, calls, warmup),
                   "function_us": median_host_us(function, calls, warmup)}
            for name, (op, function) in passes(sizes, precision, impl).items()}


def host_records(sizes: step.StepSizes = step.StepSizes(), **kwargs: Any) -> list[dict[str, Any]]:
    """`host_costs` as records of the profiling notebook's schema: one per operator, layer and
    pass as the benchmarks name them, impl "torch_ops_host" with the operator's host time as
    time_us and the public function's beside it as "function_us"."""
    return [{"layer": PASS_OF_FUNCTION[name][0], "pass": PASS_OF_FUNCTION[name][1], "impl": "torch_ops_host",
             "params": {**dataclasses.asdict(sizes), "precision": kwargs.get("precision", "tf32")},
             "time_us": cost["operator_us"], "function_us": cost["function_us"], "timing": HOST_TIMING}
            for name, cost in host_costs(sizes, **kwargs).items()]


def host_profile(fn: Callable[[], Any], calls: int = 200, warmup: int = 20, top: int = 25) -> str:
    """cProfile's table of `calls` calls of fn after `warmup` (the `top` functions by their own
    time, with call counts and cumulative times): which Python functions the host time of a
    call goes to. cProfile's own overhead inflates every entry, so read the shares, and time
    with median_host_us."""
    for _ in range(warmup):
        fn()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m foxcute.lab.torch_ops", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", nargs="+", metavar="PASS",
                        help="profile the public function and the operator of these passes (or 'all') "
                             "instead of timing them")
    args = parser.parse_args(argv)
    if args.profile:
        names = list(PASS_OF_FUNCTION) if args.profile == ["all"] else args.profile
        unknown = [n for n in names if n not in PASS_OF_FUNCTION]
        if unknown:  # before anything touches the GPU
            parser.error(f"unknown passes {unknown}; known: {', '.join(PASS_OF_FUNCTION)}")
        found = passes(step.StepSizes())
        for name in names:
            operator, function = found[name]
            print(f"== {name}: the public function, cProfile\n{host_profile(function)}")
            print(f"== {name}: the operator, cProfile\n{host_profile(operator)}")
        return
    print(f"{'pass':28} {'operator us':>12} {'function us':>12}")
    for name, cost in host_costs().items():
        print(f"{name:28} {cost['operator_us']:12.1f} {cost['function_us']:12.1f}")


if __name__ == "__main__":
    main()
