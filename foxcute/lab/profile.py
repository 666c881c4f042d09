"""One layer pass at the trainer's sizes, launched a few times after a warm-up, for a profiler:

    ncu --set full --import-source yes --kernel-name regex:FusedBackward --launch-skip 2 \\
        --launch-count 1 -o mamba2_bwd python -m foxcute.lab.profile mamba2.backward --impl cute_fused
    nsys profile -o curiosity python -m foxcute.lab.profile curiosity.forward_backward

Cases and implementations are foxcute.lab.benchmarks' (`--list` prints them with the
implementations present here). The warm-up call compiles; `--calls` more follow, so a
profiler that skips the first launches of a kernel sees steady-state ones.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from . import benchmarks
from .compare import select


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m foxcute.lab.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("case", nargs="?", help="a case name, e.g. mamba2.backward or column_sum.forward[N=3]")
    parser.add_argument("--impl", help="an implementation name (default: the first cute one of the case)")
    parser.add_argument("--calls", type=int, default=3, help="launches after the warm-up (default 3)")
    parser.add_argument("--list", action="store_true", help="print the cases and their implementations")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.list or args.case is None:
        found = benchmarks.impls()
        for case in benchmarks.CASES:
            print(f"{case.name:36s} {' '.join(impl.name for impl in found if impl.applies(case))}")
        return 0 if args.list else 2
    try:
        case, impl = select(benchmarks, args.case, args.impl)
    except ValueError as exc:
        print(f"foxcute.lab.profile: {exc}", file=sys.stderr)
        return 2
    if args.calls < 1:
        print(f"foxcute.lab.profile: --calls must be >= 1, got {args.calls}", file=sys.stderr)
        return 2
    fn = impl.make(case, benchmarks.to_device(case.make(np.random.default_rng(0), case.sizes), impl.library))
    for _ in range(1 + args.calls):
        fn()
    if impl.library == "cupy":
        import cupy

        cupy.cuda.runtime.deviceSynchronize()
    else:
        import torch

        torch.cuda.synchronize()
    print(f"{case.name} {impl.name}: {1 + args.calls} calls at {case.sizes}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
