"""Where a result came from: time, commit, package versions, GPU, driver, CUDA, host.

Nothing here needs a GPU: without one the GPU fields are None. The git commit comes from
FOXCUTE_GIT_COMMIT when set (the GPU machine's copy of the project has no usable .git), else
from `git rev-parse HEAD` in the repository holding this package. A commit passed in by hand
can be wrong (one GPU run recorded a stale commit), so a run also records the SHA-256 of the
source files it ran (`source_digest`), which `check_run` compares with the recorded commit's.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]  # foxcute/lab/provenance.py -> the checkout

# distribution name -> module whose __version__ answers when the distribution has no metadata
# (the GPU machine's kit unpacks the DSL onto PYTHONPATH).
PACKAGES = {
    "foxcute": "foxcute",
    "nvidia-cutlass-dsl": "cutlass",
    "nvidia-cutlass": "pycute",
    "cupy-cuda13x": "cupy",
    "torch": "torch",
    "numpy": "numpy",
    "papermill": "papermill",
}


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git_bytes(*args: str, root: Path = REPO_ROOT, timeout: float = 60) -> bytes | None:
    """git's stdout, or None where git is missing, fails or times out."""
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _git(*args: str) -> str | None:
    out = _git_bytes(*args, timeout=20)
    return None if out is None else out.decode().strip()


# The files that decide what a run computes: the build file, the package, the notebooks.
SOURCE_ROOTS = ("pyproject.toml", "foxcute", "notebooks")


def _is_source(path: str) -> bool:
    """path (relative, '/'-separated): pyproject.toml, foxcute/**/*.py or notebooks/*.ipynb."""
    return path == "pyproject.toml" or (path.startswith("foxcute/") and path.endswith(".py")) or \
        (path.startswith("notebooks/") and path.endswith(".ipynb") and path.count("/") == 1)


def _digest(files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\0{len(files[path])}\0".encode())
        digest.update(files[path])
    return digest.hexdigest()


def source_digest(root: Path = REPO_ROOT) -> str:
    """SHA-256 over the source files under `root` as they are on disk (tracked or not)."""
    paths = [p for top in SOURCE_ROOTS for p in ((root / top), *(root / top).rglob("*"))]
    return _digest({p.relative_to(root).as_posix(): p.read_bytes() for p in paths
                    if p.is_file() and _is_source(p.relative_to(root).as_posix())})


def commit_source_digest(commit: str, root: Path = REPO_ROOT) -> str | None:
    """source_digest of the files as `commit` has them; None where git cannot read it."""
    listing = _git_bytes("ls-tree", "-r", "--name-only", "-z", commit, "--", *SOURCE_ROOTS, root=root)
    if listing is None:
        return None
    files = {}
    for name in (n.decode() for n in listing.split(b"\0") if n):
        if _is_source(name):
            content = _git_bytes("show", f"{commit}:{name}", root=root)
            if content is None:
                return None
            files[name] = content
    return _digest(files)


def check_run(prov: dict[str, Any], root: Path = REPO_ROOT) -> tuple[bool, str]:
    """Whether a run's provenance (its manifest's) holds: the source digest it recorded is
    that of its recorded commit in the repository at `root`. Returns (ok, what was found)."""
    commit, recorded = prov.get("git_commit"), prov.get("source_sha256")
    if not commit or not recorded:
        return False, f"cannot check: the run recorded {'no commit' if not commit else 'no source digest'}"
    expected = commit_source_digest(commit, root)
    if expected is None:
        return False, f"cannot check: commit {commit} is not readable in {root}"
    if expected != recorded:
        return False, f"the sources it ran are not those of its recorded commit {commit[:12]}"
    return True, f"the sources it ran are those of its recorded commit {commit[:12]}"


def git_state() -> dict[str, Any]:
    """{"git_commit": sha or None, "git_dirty": bool or None (unknown)}."""
    commit = os.environ.get("FOXCUTE_GIT_COMMIT")
    if commit:
        return {"git_commit": commit, "git_dirty": None}
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status)}


def package_version(dist: str, module: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    if dist == "torch" and module not in sys.modules:
        try:  # torch is optional; find it without the 2-second import when it is absent
            if importlib.util.find_spec("torch") is None:
                return None
        except ValueError:
            return None
    try:
        return str(getattr(importlib.import_module(module), "__version__", None))
    except Exception:  # not installed, or broken: either way no version to report
        return None


def package_versions() -> dict[str, str | None]:
    return {dist: package_version(dist, module) for dist, module in PACKAGES.items()}


def _nvidia_smi() -> dict[str, str] | None:
    fields = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem")
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader",
                               "--id=0"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout.strip():
        return None
    values = [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]
    return dict(zip(fields, values))


def gpu_available() -> bool:
    """True when cupy sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy or no driver
        return False


def gpu_info() -> dict[str, Any]:
    """GPU 0's name, compute capability, driver and CUDA versions and clocks; all None
    without a usable GPU."""
    info: dict[str, Any] = {"gpu": None, "compute_capability": None, "driver": None,
                            "cuda_driver_api": None, "cuda_runtime": None, "clocks": None}
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return info
        props = cupy.cuda.runtime.getDeviceProperties(0)
        info["gpu"] = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        info["compute_capability"] = f"{props['major']}.{props['minor']}"
        info["cuda_driver_api"] = _cuda_version(cupy.cuda.runtime.driverGetVersion())
        info["cuda_runtime"] = _cuda_version(cupy.cuda.runtime.runtimeGetVersion())
    except Exception:  # no cupy, no driver, no device: report no GPU
        return info
    smi = _nvidia_smi()
    if smi is not None:
        info["driver"] = smi["driver_version"]
        info["clocks"] = {k: smi[k] for k in ("clocks.sm", "clocks.max.sm", "clocks.mem")}
    return info


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


def collect() -> dict[str, Any]:
    """Everything above as one JSON-ready dict."""
    return {
        "utc": utc_now(),
        **git_state(),
        "source_sha256": source_digest(),
        **gpu_info(),
        "packages": package_versions(),
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
    }
