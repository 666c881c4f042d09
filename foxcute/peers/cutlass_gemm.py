"""CUTLASS C++ peer of foxcute's GEMM on Hopper's TF32 wgmma, as CUTLASS 3's collective
builders make it (cutlass_gemm.cu): `Matmul` (D = A @ B_t^T) and `WeightGrad` (dW = dY^T X,
split-K, deterministic), built with nvcc for sm_90a against the CUTLASS headers that the
nvidia-cutlass wheel ships (cutlass_library/source) and called through ctypes.

It is a peer where it builds: `unavailable()` says why not (no nvcc, no headers), and the
build is cached by the hash of the source, the compiler's version and the flags, so a
machine compiles it once (~50 s on 2 cores). `build()` works without a GPU (CI checks its SASS).

Untuned: the builders' automatic schedules, one 128-row tile shape per N, no clusters. On the
H200 (run 20261201T202538Z) it took 24.0, 66.4 and 94.0 us at the seed Mamba2's projection,
read-back and weight gradient, where cuBLAS (TF32) took 26.8, 30.5 and 31.5: the read-back
(K = 32, one k-block a tile) and the split-K weight gradient (its register-A mainloop
spills) are the configurations to tune before reading them as CUTLASS's best.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _arrays

SOURCE = Path(__file__).with_name("cutlass_gemm.cu")
FLAGS = ("-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr",
         # sm_90a: wgmma and TMA are only in the architecture-specific target
         "-gencode=arch=compute_90a,code=sm_90a",
         "-Xcompiler", "-fPIC", "-shared")
LIBRARY_NAME = "libfoxcute_cutlass_gemm.so"
STATUS_SUCCESS = 0  # cutlass::Status::kSuccess
TILE_M = 128  # output rows a CTA computes (cutlass_gemm.cu's TileShape)


def nvcc() -> str | None:
    """The CUDA compiler: on PATH, else under $CUDA_HOME or /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    return None


def include_dirs() -> list[Path] | None:
    """CUTLASS's C++ headers as the nvidia-cutlass wheel ships them, or None without it."""
    try:
        import cutlass_library
    except ImportError:
        return None
    source = Path(cutlass_library.__file__).parent / "source"
    dirs = [source / "include", source / "tools" / "util" / "include"]
    return dirs if all(d.is_dir() for d in dirs) else None


def unavailable() -> str | None:
    """Why the peer cannot be built here, or None when it can."""
    if nvcc() is None:
        return "no nvcc (CUDA compiler) found on PATH, $CUDA_HOME or /usr/local/cuda"
    if include_dirs() is None:
        return "no CUTLASS C++ headers: the nvidia-cutlass wheel (cutlass_library/source) is not installed"
    return None


def cache_dir() -> Path:
    """$FOXCUTE_CACHE_DIR, else the user's cache folder, else (not writable) the temp folder."""
    root = os.environ.get("FOXCUTE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "foxcute")
    target = Path(root) / "cutlass_gemm"
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError:
        target = Path(tempfile.gettempdir()) / f"foxcute-{os.getuid()}" / "cutlass_gemm"
    return target


@dataclass(frozen=True)
class Build:
    library: Path  # the shared library ctypes loads
    cubin: Path    # its device code, kept for disassembly
    log: str = field(repr=False)  # nvcc's output, with ptxas' resource report (-Xptxas -v)


def build() -> Build:
    """Compile cutlass_gemm.cu (or find it compiled) and return where it lies. Concurrent
    callers (pytest workers) wait on a file lock; the folder appears whole or not at all."""
    reason = unavailable()
    if reason:
        raise RuntimeError(f"the CUTLASS C++ GEMM cannot be built here: {reason}")
    compiler, includes = nvcc(), include_dirs()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([SOURCE.read_text(), version, *FLAGS, *map(str, includes)]).encode())
    target = cache_dir() / key.hexdigest()[:16]
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / LIBRARY_NAME).exists():
            work = Path(tempfile.mkdtemp(dir=target.parent))
            cmd = [compiler, *FLAGS, *(f"-I{d}" for d in includes), "-Xptxas", "-v", "--keep",
                   "--keep-dir", str(work), "-o", str(work / LIBRARY_NAME), str(SOURCE)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                shutil.rmtree(work, ignore_errors=True)
                raise RuntimeError(f"nvcc failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}{done.stderr}")
            (work / "build.log").write_text(done.stdout + done.stderr)
            os.replace(work / f"{SOURCE.stem}.cubin", work / "gemm.cubin")
            for extra in work.iterdir():  # nvcc's intermediate files: only the cubin is kept
                if extra.name not in (LIBRARY_NAME, "gemm.cubin", "build.log"):
                    extra.unlink()
            os.replace(work, target)
    return Build(target / LIBRARY_NAME, target / "gemm.cubin", (target / "build.log").read_text())


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build().library))
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    lib.foxcute_cutlass_tile_ns.argtypes = [ctypes.POINTER(i32), i32]
    for plan, sizes in ((lib.foxcute_cutlass_matmul_plan, [i32] * 3),
                        (lib.foxcute_cutlass_weight_grad_plan, [i32] * 4)):
        plan.restype = ptr
        plan.argtypes = [i32, i32, ptr, ptr, ptr, *sizes, ctypes.POINTER(i32)]
    lib.foxcute_cutlass_launch.argtypes = [ptr, ptr]
    lib.foxcute_cutlass_free.argtypes = [ptr]
    return lib


def tile_widths() -> tuple[int, ...]:
    """The tile widths (columns of the output a CTA computes) the library was built with."""
    out = (ctypes.c_int * 8)()
    return tuple(out[:_library().foxcute_cutlass_tile_ns(out, 8)])


def _tile_for(n: int) -> int:
    """The narrowest built tile width that spans n columns (the widest past 128)."""
    return next((t for t in tile_widths() if t >= n), tile_widths()[-1])


class _Plan:
    """A CUTLASS GEMM bound to its arrays: CUTLASS initializes the kernel's parameters (and any
    workspace) once, at construction; each call launches on the current stream of the arrays'
    library and returns `out`, so calls can be captured in a CUDA graph."""

    where = ""

    def _bind(self, make_plan, arrays: tuple, out: Any, *sizes: int) -> None:
        self.arrays, self.out = arrays, out  # the plan holds their addresses
        kind = _arrays.array_kind(out)
        status = ctypes.c_int(STATUS_SUCCESS)
        self._free = _library().foxcute_cutlass_free  # held: __del__ may run at interpreter exit
        self._plan = make_plan(_arrays.device_id(out, kind), self.tile_n,
                               *(_arrays.data_ptr(a, kind) for a in (*arrays, out)), *sizes, ctypes.byref(status))
        if not self._plan:
            raise RuntimeError(f"{self.where}: CUTLASS refused sizes {sizes} (cutlass::Status {status.value})")

    def __call__(self) -> Any:
        status = _library().foxcute_cutlass_launch(self._plan, _arrays.current_stream_handle(self.out))
        if status != STATUS_SUCCESS:
            raise RuntimeError(f"{self.where}: launch failed, status {status} (1000+ = CUDA error)")
        return self.out

    def __del__(self) -> None:
        if getattr(self, "_plan", None):
            self._free(self._plan)
            self._plan = None


class Matmul(_Plan):
    """D = A @ B_t^T for float32 cupy arrays / torch CUDA tensors A [M, K], B_t [N, K] (K and N
    multiples of 4: 16-byte rows for TMA); returns `out` [M, N]."""

    where = "foxcute.peers.cutlass_gemm.Matmul"

    def __init__(self, A: Any, B_t: Any, out: Any = None):
        chk = _arrays.Checker(self.where, gpu=True)
        chk.array("A", A, ("M", "K"))
        chk.array("B_t", B_t, ("N", "K"))
        chk.dim_range("M", 1, 2**31 - 1, "CUTLASS's int problem shape")
        chk.dim_multiple("K", 4, "TMA needs 16-byte row strides")
        chk.dim_multiple("N", 4, "TMA needs 16-byte row strides in D")
        m, n, k = chk.dims["M"], chk.dims["N"], chk.dims["K"]
        out = chk.output(out, ("M", "N"), A)
        self.tile_n = _tile_for(n)
        self._bind(_library().foxcute_cutlass_matmul_plan, (A, B_t), out, m, n, k)


class WeightGrad(_Plan):
    """dW = dY^T X [N, K] for float32 cupy arrays / torch CUDA tensors dY [M, N], X [M, K] (N
    and K multiples of 4), split `splits` ways over the M rows (None: as many as fill the
    GPU's multiprocessors with the output's tiles); the splits of a tile are summed in row
    order (CUTLASS's deterministic turnstile). Returns `out` [N, K]."""

    where = "foxcute.peers.cutlass_gemm.WeightGrad"
    BLOCK_K = 32  # rows of the reduction a mainloop step takes (the tile's K)

    def __init__(self, dY: Any, X: Any, out: Any = None, splits: int | None = None):
        chk = _arrays.Checker(self.where, gpu=True)
        chk.array("dY", dY, ("M", "N"))
        chk.array("X", X, ("M", "K"))
        chk.dim_range("M", 1, 2**31 - 1, "CUTLASS's int problem shape")
        chk.dim_multiple("N", 4, "TMA needs 16-byte row strides")
        chk.dim_multiple("K", 4, "TMA needs 16-byte row strides")
        m, n, k = chk.dims["M"], chk.dims["N"], chk.dims["K"]
        out = chk.output(out, ("N", "K"), dY)
        self.tile_n = _tile_for(k)
        blocks = -(-m // self.BLOCK_K)
        if splits is None:
            tiles = -(-n // TILE_M) * -(-k // self.tile_n)
            splits = max(1, min(_arrays.sm_count(dY) // tiles, blocks))
        elif not 1 <= splits <= blocks:
            raise _arrays.FoxcuteInputError(f"{self.where}: splits={splits} is outside 1..{blocks} "
                                            f"(the {m} rows' {self.BLOCK_K}-row blocks)")
        self.splits = splits
        self._bind(_library().foxcute_cutlass_weight_grad_plan, (dY, X), out, m, n, k, splits)
