"""Every GPU kernel once, at small odd sizes, for compute-sanitizer:

    compute-sanitizer --tool memcheck  python -m foxcute.lab.sanitize
    compute-sanitizer --tool racecheck python -m foxcute.lab.sanitize [layer ...]

Each layer pass of foxcute.lab.benchmarks.CASES (of the named layers, or all) runs through its
public function on every GPU backend, implementation and precision at the case's odd sizes
(tiles cut off at every edge), and its outputs are compared with the float64 reference, so a
kernel that reads or writes out of bounds, races, or computes wrongly is reported. Exits
non-zero on a wrong result.
"""

from __future__ import annotations

import sys

import numpy as np

from . import benchmarks
from .._arrays import FoxcuteInputError
from ..checks import TOLERANCE


def main(layers: list[str]) -> int:
    known = {case.layer for case in benchmarks.CASES}
    unknown = sorted(set(layers) - known)
    if unknown:
        print(f"foxcute.lab.sanitize: unknown layer(s) {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    failures = 0
    for case in benchmarks.CASES:
        if layers and case.layer not in layers:
            continue
        inputs = case.make(rng, case.odd_sizes)
        reference = benchmarks.reference(case, inputs)
        device_inputs = benchmarks.to_device(inputs)
        for backend in benchmarks.layer_kernels(case.layer):
            for options in benchmarks.variants(case, backend):
                try:
                    outputs = benchmarks.call_layer(case, device_inputs, backend=backend, **options)
                except FoxcuteInputError as exc:  # sizes this kernel does not take: nothing launched
                    print(f"{case.name:28s} {backend:6s} {options!s:40s} unsupported: {exc}", flush=True)
                    continue
                worst = max(benchmarks.output_errors(case, inputs, outputs, reference).values())
                ok = worst <= TOLERANCE[options.get("precision", "fp32")]
                failures += not ok
                print(f"{case.name:28s} {backend:6s} {options!s:40s} rel_err {worst:.1e} {'ok' if ok else 'WRONG'}",
                      flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
