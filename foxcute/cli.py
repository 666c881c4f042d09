"""Command line: `foxcute run|index|check-run|ptx|cache|export ...` (also `python -m foxcute ...`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from .lab import runner


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="foxcute", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the notebooks with papermill into a new run folder",
                         description=runner.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--preset", default="auto", choices=["auto", *runner.PRESETS],
                     help="parameter set: cpu, h200, or auto (h200 where a GPU is usable, else cpu)")
    run.add_argument("--notebook", action="append", dest="notebooks", metavar="NAME",
                     help="run only this notebook (stem or file name); repeatable; default: all")
    run.add_argument("--param", action="append", dest="params", default=[], metavar="NAME=VALUE",
                     help="override a notebook parameter, parsed by the type of its default; repeatable")
    run.add_argument("--out", type=Path, default=runner.DEFAULT_OUT,
                     help="folder that receives the run folder and the index README.md")
    run.add_argument("-v", "--verbose", action="store_true",
                     help="show papermill's log: every cell's start, end and printed output")
    run.add_argument("--timeout-cell", type=float, default=runner.DEFAULT_CELL_TIMEOUT_S, metavar="S",
                     help="seconds any one cell may run (default %(default)s)")
    run.add_argument("--resume", type=Path, metavar="RUN_DIR",
                     help="finish an incomplete run folder (cut off by a time limit): its notebooks not "
                          "yet ok, with its preset and parameters, from the same sources on the same GPU")
    index = sub.add_parser("index", help="rebuild papermill_runs/README.md and README.md's results "
                                         "block from the committed run folders")
    index.add_argument("--out", type=Path, default=runner.DEFAULT_OUT, help="the runs folder")
    index.add_argument("--readme", type=Path, default=runner.DEFAULT_OUT.parent / "README.md")
    check = sub.add_parser("check-run", help="check that a run folder's recorded source digest is its "
                                             "recorded commit's (exit 1 where not)")
    check.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR")
    ptx = sub.add_parser("ptx", help="print the SHA-256 of every kernel's PTX as JSON (compiled for "
                                     "sm_90a, no GPU needed): compare two checkouts' outputs")
    ptx.add_argument("--module", action="append", dest="modules", metavar="NAME",
                     help="only this foxcute.kernels module; repeatable; default: all")
    cache = sub.add_parser("cache", help="the compiled-kernel cache on disk: where it is and what it holds "
                                         "(info), or empty it (clear)")
    cache.add_argument("action", choices=["info", "clear"])
    add_export_parser(sub)
    return parser


def add_export_parser(sub) -> None:
    export = sub.add_parser("export", help="compile the layer passes' kernels for sm_90a (no GPU needed) into "
                                           "a C library: foxcute.h, libfoxcute.a, manifest.json "
                                           "(docs/export.md)")
    export.add_argument("--out", type=Path, required=True, help="folder that receives the three files")
    export.add_argument("--sizes", default="trainer", metavar="trainer|NAME=N,...",
                        help="the step's default sizes, or overrides of them (foxcute.step.StepSizes "
                             "names, e.g. SH2=256,H_risk=64); default %(default)s")
    export.add_argument("--precision", default="tf32", choices=["tf32", "fp32"],
                        help="matrix products in TF32 or full float32; default %(default)s")


def run_export(args: argparse.Namespace) -> int:
    from . import export

    try:
        manifest = export.export(args.out, export.parse_sizes(args.sizes), args.precision)
    except export.ExportError as exc:
        print(f"foxcute export: error: {exc}", file=sys.stderr)
        return 2
    kernels = sum(len(k) for k in manifest["passes"].values())
    print(f"{args.out}: {len(manifest['passes'])} passes, {kernels} kernels ({manifest['arch']}, "
          f"{manifest['precision']})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "verbose", False):  # papermill logs each cell's start, end and output
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    if args.command == "ptx":
        # a folder of its own for the DSL's kept PTX files: two checkouts hashed at once would
        # otherwise write the same file names in the default one
        os.environ.setdefault("CUTE_DSL_DUMP_DIR", tempfile.mkdtemp(prefix="foxcute-ptx-"))
        from .lab import benchmarks

        print(json.dumps(benchmarks.ptx_digests(args.modules), indent=1, sort_keys=True))
        return 0
    if args.command == "cache":
        from .kernels import _compile_cache

        if args.action == "clear":
            print(f"removed {_compile_cache.clear()} entries from {_compile_cache.cache_dir()}")
        else:
            print(json.dumps(_compile_cache.info(), indent=1))
        return 0
    if args.command == "export":
        return run_export(args)
    if args.command == "check-run":
        from .lab import provenance

        failed = 0
        for run_dir in args.run_dirs:
            manifest = json.loads((run_dir / "manifest.json").read_text())
            ok, found = provenance.check_run(manifest["provenance"])
            failed += not ok
            print(f"{run_dir.name}: {'ok' if ok else 'FAILED'}: {found}")
        return 1 if failed else 0
    if args.command == "index":
        print(runner.write_index(args.out))
        if runner.update_readme(args.readme, args.out):
            runs = dict.fromkeys(r.name for r in runner.readme_runs(args.out) if r is not None)
            print(f"{args.readme}: results block from {', '.join(runs)}")
        return 0
    try:
        code, _ = runner.run(preset=args.preset, notebook_names=args.notebooks, param_pairs=args.params,
                             out_dir=args.out, cell_timeout_s=args.timeout_cell, resume=args.resume)
    except runner.RunnerError as exc:
        print(f"foxcute run: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
