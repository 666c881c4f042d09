"""One layer pass on the GPU, compared between source trees (an A/B of a kernel change):

    python -m foxcute.lab.compare mamba2.backward --impl cute_fused --tree . --tree ../base

Each tree's foxcute runs in a subprocess of its own (this file run as a script, the tree
first on sys.path, so a tree from before this tool works too), on the same inputs (the
case's trainer sizes, seed 0): its median time as the profiling notebook takes it
(timing.bench, CUDA-graph replays where the implementation allows, after
timing.check_graph_replay), its largest relative error against float64 (the correctness
notebook's benchmarks.output_errors), whether repeated calls are bit-identical, and whether
every output is bit-identical to the first tree's. Rounds alternate the trees (A B A B ...),
so that a machine's drift shows as spread in each tree's times rather than as a difference
between them. Cases and implementations are foxcute.lab.benchmarks' (python -m foxcute.lab.profile
--list prints them).
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and not __package__ and sys.path[0] == __file__.rsplit("/", 1)[0]:
    # run as a script (a worker): its own folder off sys.path, where foxcute's modules would
    # shadow top-level ones (profile.py the standard library's, which cProfile imports)
    del sys.path[0]

import argparse  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

WORKER_TAG = "foxcute.lab.compare:"  # marks the worker's one result line on its stdout


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m foxcute.lab.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("case", help="a case name, e.g. mamba2.backward or column_sum.forward[N=3]")
    parser.add_argument("--impl", help="an implementation name (default: the first cute one of the case)")
    parser.add_argument("--tree", action="append", default=[], type=Path,
                        help="a source tree holding a foxcute package; give two or more")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds over the trees (default 2)")
    parser.add_argument("--reps", type=int, default=100, help="timed event pairs a measurement (default 100)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    return parser


def _digest(x) -> str:
    to_numpy = importlib.import_module("foxcute.checks").to_numpy
    return hashlib.sha256(np.ascontiguousarray(to_numpy(x)).tobytes()).hexdigest()


def select(benchmarks, case_name: str, impl_name: str | None) -> tuple:
    """(case, implementation) by name from `benchmarks`, a foxcute.lab.benchmarks module (in a
    worker the tree's own, which may predate this file: hence a parameter); the
    implementation by default the case's first cute one. ValueError naming what is there
    otherwise."""
    case = next((c for c in benchmarks.CASES if c.name == case_name), None)
    if case is None:
        raise ValueError(f"unknown case {case_name!r}; python -m foxcute.lab.profile --list shows them")
    impls = [impl for impl in benchmarks.impls() if impl.applies(case)]
    names = [impl.name for impl in impls]
    wanted = impl_name or next((n for n in names if n.startswith("cute")), None)
    if wanted not in names:
        raise ValueError(f"{case_name} has no implementation {wanted!r} here; present: {names}")
    return case, impls[names.index(wanted)]


def _tree_module(name: str):
    """The tree's own harness module `name`: foxcute.lab.<name>, or foxcute.<name> in a tree
    from before the harness moved into foxcute/lab/ (so such a tree can still be compared)."""
    try:
        return importlib.import_module(f"foxcute.lab.{name}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("foxcute.lab", f"foxcute.lab.{name}"):
            raise
        return importlib.import_module(f"foxcute.{name}")


def worker(case_name: str, impl_name: str | None, reps: int, check: bool) -> dict:
    """Runs against the tree under test (whichever foxcute is first on sys.path): the case
    with `impl_name`, timed; with `check` also its errors and output digests."""
    benchmarks, timing = _tree_module("benchmarks"), _tree_module("timing")
    try:
        case, impl = select(benchmarks, case_name, impl_name)
    except ValueError as exc:
        raise SystemExit(f"foxcute.lab.compare: {exc}") from None
    inputs = case.make(np.random.default_rng(0), case.sizes)
    fn = impl.make(case, benchmarks.to_device(inputs, impl.library))
    result = {"foxcute": str(Path(importlib.import_module("foxcute").__file__).resolve().parent),
              "impl": impl.name}
    if check:
        outputs = benchmarks.flatten(fn())
        again = benchmarks.flatten(fn())
        result["digests"] = [_digest(o) for o in outputs]
        result["repeatable"] = result["digests"] == [_digest(o) for o in again]
        errors = benchmarks.output_errors(case, inputs, outputs, benchmarks.reference(case, inputs))
        result["max_rel_err"] = max(errors.values())
    if impl.graph:
        timing.check_graph_replay(fn, library=impl.library)
    result["us"], _ = timing.bench(fn, graph=impl.graph, reps=reps, library=impl.library)
    return result


def _run_worker(tree: Path, args: argparse.Namespace, check: bool) -> dict:
    path = [str(tree)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    command = [sys.executable, str(Path(__file__).resolve()), args.case, "--worker", "--reps", str(args.reps)] \
        + (["--impl", args.impl] if args.impl else []) + (["--check"] if check else [])
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(WORKER_TAG)]
    if done.returncode != 0 or not lines:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise SystemExit(f"foxcute.lab.compare: the run in {tree} failed (exit {done.returncode}):\n{tail}")
    return json.loads(lines[-1][len(WORKER_TAG):])


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.worker:
        print(WORKER_TAG + json.dumps(worker(args.case, args.impl, args.reps, args.check)), flush=True)
        return 0
    if len(args.tree) < 2 or args.rounds < 1 or args.reps < 1:
        print("foxcute.lab.compare: give at least two --tree, and --rounds, --reps >= 1", file=sys.stderr)
        return 2
    trees = [tree.resolve() for tree in args.tree]
    missing = [str(tree) for tree in trees if not (tree / "foxcute" / "__init__.py").is_file()]
    if missing:
        print(f"foxcute.lab.compare: no foxcute package in {', '.join(missing)}", file=sys.stderr)
        return 2
    if not importlib.import_module("foxcute.lab.provenance").gpu_available():
        print("foxcute.lab.compare: no CUDA GPU here (it times kernels on one)", file=sys.stderr)
        return 2
    runs = {tree: [] for tree in trees}
    for round_ in range(args.rounds):
        for tree in trees:
            runs[tree].append(_run_worker(tree, args, check=round_ == 0))
    first = runs[trees[0]][0]
    print(f"{args.case} {first['impl']}: us per call (median of {args.reps}), one column a round")
    for tree in trees:
        checked = runs[tree][0]
        if Path(checked["foxcute"]) != tree / "foxcute":
            print(f"foxcute.lab.compare: the run for {tree} imported {checked['foxcute']}", file=sys.stderr)
            return 1
        same = checked["digests"] == first["digests"]
        times = " ".join(f"{r['us']:9.2f}" for r in runs[tree])
        print(f"{times}   max rel err {checked['max_rel_err']:.2e}   repeatable {checked['repeatable']}   "
              f"bit-identical to the first tree {same}   {tree}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
