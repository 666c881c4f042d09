"""The on-disk compile cache under _cute.CompiledCache: compiled kernels stored as the DSL's
object files and loaded by a new process instead of compiled again: 3-8 ms a kernel on the
CPU box (68 kernels in 0.23 s) against 0.1-3 s to compile on the GPU machine.

Mechanism (nvidia-cutlass-dsl 4.8.1). `JitCompiledFunction.dump_to_object(prefix)` gives
the ELF object that `export_to_c` writes (host launch code, the cubin embedded, metadata
with the function's signature and the DSL version) without its C header: `export_to_c`
itself fails on foxcute's kernels, its header generator rejecting the unannotated `stream`
argument ("Unsupported argument for c function argument generation: stream = <CUstream
0x0> with type annotation <class 'inspect._empty'>"), and Python needs no header.
`cute.runtime.load_module(path)[prefix]` links it back into a
`CudaDialectJitCompiledFunction`, the class `cute.compile` returns, so a loaded kernel
takes the same arguments (raw pointers, Int32, cuda.CUstream) through the same call path
as a compiled one. Dumping and loading need no GPU (nor the runtime library preloaded);
calling does (without a driver: cudaErrorInsufficientDriver). Dumping adds
~3% to a compile (4.5 s over 134 s for 68 kernels on the CPU box). The TVM-FFI export
(`--enable-tvm-ffi`) would change the calling convention (tvm_ffi.Function, tensors and
the environment's stream) and needs apache-tvm-ffi; it is not used.

Entries. One file per kernel, `<digest>.fxk`: a JSON header line, then the object file.
The digest is the SHA-256 of the header's key fields (`entry_header`):
- format: FORMAT_VERSION, raised whenever the entry layout or the key changes;
- module and key: the kernel module's name and the static key tuple it already caches by
  (sizes, options), canonical JSON (`canonical_key`: only str, int, float, bool, None and
  tuples/lists of them, so the text cannot hold an object address);
- source and module_source: SHA-256 of every .py file under foxcute/kernels and of the
  foxcute modules they import (SOURCE_FILES), and of the kernel module's own file (the same
  file again for a kernel module; a module elsewhere, such as the tests' wgmma probe, has
  its own file and foxcute/kernels). A kernel's code is whatever its Python traces, and
  everything it can trace is in those files (tests/test_compile_cache.py checks that the
  kernels import nothing else from foxcute): an edit there invalidates every entry it could
  touch, and more (any kernel file edited misses every entry), never fewer;
- dsl and cuda: the nvidia-cutlass-dsl version and the CUDA flavour of its runtime library
  (cu12/cu13, chosen at import from the driver); the DSL's loader also checks the version
  recorded in the object;
- arch (CUTE_DSL_ARCH), host (the machine type the host code was built for), options (the
  compile options string, _cute.COMPILE_OPTIONS) and dsl_env (every other CUTE_DSL_*
  variable, which can change code: opt level, line info, assertions; output and logging
  paths excluded).
The header also holds the object's prefix (its symbol prefix), size and SHA-256.

Safety.
- Writers write a temporary file in the cache folder and os.replace it onto the entry: a
  reader sees the old entry, no entry, or the whole new one, never a partial file.
  Concurrent writers of one entry each replace it whole (the last one stays); there is no
  lock, so two processes may both compile a kernel that neither has stored yet.
- A reader checks the header against the key it expects and the object's SHA-256 before
  linking it (a torn or truncated file, say after a power loss, fails the digest). A
  mismatch, a failed check or a failed load deletes the entry with a CompileCacheWarning
  and the caller compiles again; the cache never raises into a kernel call. A reader that
  deletes an entry another process has just rewritten costs that process a recompile.
- Compiles with PTX kept (`keep=True`, CI's checks) are never stored, so never loaded.

Location: kernels/ in FOXCUTE_CACHE_DIR, else in $XDG_CACHE_HOME/foxcute, else in
~/.cache/foxcute. FOXCUTE_CACHE=0 turns the cache off. `foxcute cache info` / `foxcute cache clear`.
Entries are never evicted: `clear` empties the folder (a step's kernels take a few MB).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
SUFFIX = ".fxk"
KERNELS_DIR = Path(__file__).resolve().parent
# The foxcute modules outside kernels/ that kernel modules import (test_compile_cache checks
# the list against their imports).
SOURCE_FILES = ("_arrays.py", "_layer.py")
# CUTE_DSL_* variables that name output folders or logging, not code.
_ENV_NOT_KEYED = ("CUTE_DSL_ARCH", "CUTE_DSL_DUMP_DIR", "CUTE_DSL_CACHE_DIR", "CUTE_DSL_LOG_LEVEL",
                  "CUTE_DSL_LOG_TO_CONSOLE", "CUTE_DSL_LOG_TO_FILE")


class CompileCacheWarning(UserWarning):
    """A cache entry was unusable (deleted, to be compiled again) or could not be written."""


def enabled() -> bool:
    """False where FOXCUTE_CACHE=0. Read at each call, as is cache_dir."""
    return os.environ.get("FOXCUTE_CACHE", "1") != "0"


def cache_dir() -> Path:
    """The entries' folder: kernels/ in foxcute's cache folder (which the CUTLASS peer's
    builds share, in cutlass_gemm/)."""
    chosen = os.environ.get("FOXCUTE_CACHE_DIR")
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(chosen) if chosen else (Path(xdg) if xdg else Path.home() / ".cache") / "foxcute"
    return root / "kernels"


def dsl_version() -> str:
    return importlib.metadata.version("nvidia-cutlass-dsl")


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """SHA-256 over the kernel sources: each file's path relative to foxcute/ and bytes."""
    package = KERNELS_DIR.parent
    files = sorted(KERNELS_DIR.rglob("*.py")) + [package / name for name in SOURCE_FILES]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def module_fingerprint(module: str) -> str:
    """SHA-256 of the file of the imported module named `module`."""
    return hashlib.sha256(Path(sys.modules[module].__file__).read_bytes()).hexdigest()


@functools.lru_cache(maxsize=1)
def _cuda_flavour() -> str:
    from cutlass.cute.runtime import find_runtime_libraries

    # .../nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so -> cu13
    return ",".join(Path(lib).parent.parent.name for lib in find_runtime_libraries(enable_tvm_ffi=False))


def environment() -> dict[str, Any]:
    """The key fields every entry of this process shares (all but module and key)."""
    from . import _cute

    return {"format": FORMAT_VERSION, "source": source_fingerprint(), "dsl": dsl_version(),
            "cuda": _cuda_flavour(), "arch": os.environ["CUTE_DSL_ARCH"], "host": platform.machine(),
            "options": _cute.COMPILE_OPTIONS,
            "dsl_env": {k: v for k, v in sorted(os.environ.items())
                        if k.startswith("CUTE_DSL_") and k not in _ENV_NOT_KEYED}}


def canonical_key(key: Any) -> Any:
    """key as JSON-able data (tuples become lists); TypeError for anything but str, int,
    float, bool, None and tuples/lists of them, whose text could vary between processes."""
    if key is None or isinstance(key, (str, int, float, bool)):
        return key
    if isinstance(key, (tuple, list)):
        return [canonical_key(k) for k in key]
    raise TypeError(f"compile cache key part {key!r} ({type(key).__name__}) is not str, int, float, "
                    "bool, None or a tuple of them")


def entry_header(module: str, key: tuple, env: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """(digest, key fields) of the entry for `module`'s kernel at static key `key`."""
    fields = {**(environment() if env is None else env), "module": module,
              "module_source": module_fingerprint(module), "key": canonical_key(key)}
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    return digest, fields


def entry_path(folder: Path, digest: str) -> Path:
    return folder / f"{digest}{SUFFIX}"


def store(module: str, key: tuple, compiled: Any) -> Path | None:
    """Write `compiled` (from cute.compile) as the entry for (module, key); returns its path,
    None where the cache is off or the write failed (a CompileCacheWarning says why)."""
    if not enabled():
        return None
    folder = cache_dir()
    digest, fields = entry_header(module, key)
    prefix = f"foxcute_{digest[:16]}"  # the object's symbol prefix: a C identifier
    try:
        obj = compiled.dump_to_object(prefix)
        header = {**fields, "prefix": prefix, "object_bytes": len(obj),
                  "object_sha256": hashlib.sha256(obj).hexdigest()}
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{digest[:16]}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(header, sort_keys=True).encode() + b"\n")
                f.write(obj)
            path = entry_path(folder, digest)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except Exception as exc:
        warnings.warn(f"foxcute compile cache: could not store {module} {key}: {exc}", CompileCacheWarning,
                      stacklevel=2)
        return None
    return path


def load(module: str, key: tuple) -> Any:
    """The stored kernel for (module, key) as a callable like cute.compile's, or None where
    there is none (or the cache is off). An unusable entry is deleted (CompileCacheWarning)."""
    if not enabled():
        return None
    folder = cache_dir()
    digest, fields = entry_header(module, key)
    path = entry_path(folder, digest)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:  # an unreadable folder or file: compile, and leave it be
        warnings.warn(f"foxcute compile cache: could not read {path}: {exc}", CompileCacheWarning, stacklevel=2)
        return None
    try:
        header_line, obj = data.split(b"\n", 1)
        header = json.loads(header_line)
        if {k: header.get(k) for k in fields} != fields:
            raise ValueError("its header is not this kernel's key")
        if header["object_bytes"] != len(obj) or header["object_sha256"] != hashlib.sha256(obj).hexdigest():
            raise ValueError("its object file is not the one written (size or SHA-256)")
        return _link(obj, header["prefix"])
    except Exception as exc:
        warnings.warn(f"foxcute compile cache: deleted {path} ({module} {key}): {exc}", CompileCacheWarning,
                      stacklevel=2)
        path.unlink(missing_ok=True)
        return None


def _link(obj: bytes, prefix: str) -> Any:
    import cutlass.cute as cute

    # load_module takes a path and reads the file whole; an in-memory file spares a disk copy.
    fd = os.memfd_create("foxcute-kernel")
    try:
        with open(fd, "wb", closefd=False) as f:
            f.write(obj)
        return cute.runtime.load_module(f"/proc/self/fd/{fd}")[prefix]
    finally:
        os.close(fd)


def info() -> dict[str, Any]:
    """Where the cache is, whether it is on, how many entries and bytes it holds, and this
    DSL's version."""
    folder = cache_dir()
    entries = sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []
    return {"dir": str(folder), "enabled": enabled(), "entries": len(entries), "bytes": sum(p.stat().st_size for p in entries), "dsl": dsl_version()}


def clear() -> int:
    """Delete every entry (and leftover temporary file) in the cache folder; returns how many
    entries there were (FOXCUTE_CACHE=0 or not). Processes running meanwhile compile again
    what they miss."""
    folder = cache_dir()
    if not folder.is_dir():
        return 0
    removed = 0
    for path in folder.iterdir():
        if path.suffix == SUFFIX or (path.name.startswith(".") and path.suffix == ".tmp"):
            path.unlink(missing_ok=True)
            removed += path.suffix == SUFFIX
    return removed
