"""The compile cache on disk (foxcute.kernels._compile_cache, under _cute.CompiledCache), on
the CPU: its key, atomic and concurrent writes, unusable entries rebuilt, its environment
variables and command line, and a real kernel stored and loaded back in a new process
(loading needs no GPU; calling does: tests/test_gpu_compile_cache.py)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("cutlass")

from foxcute import cli  # noqa: E402
from foxcute.kernels import _compile_cache as cc  # noqa: E402
from foxcute.kernels import _cute, column_sum  # noqa: E402
from foxcute.kernels import q_denoise  # noqa: E402, F401 (imported: a key needs its module loaded)

MODULE = "foxcute.kernels.column_sum"
KEY = (3, False, False)  # column_sum's key: N=3, not kept, not dependent
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of the test's own, the cache on."""
    monkeypatch.delenv("FOXCUTE_CACHE", raising=False)
    monkeypatch.setenv("FOXCUTE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kernels"


@pytest.fixture(scope="module")
def compiled():
    """column_sum at N=3 compiled once for the module (not through any cache)."""
    return _cute.compile_kernel(column_sum._config(3), *column_sum.compile_args())


class Builds:
    """A `build` for CompiledCache.get that counts its calls and returns `compiled`."""

    def __init__(self, compiled):
        self.compiled, self.calls = compiled, 0

    def __call__(self):
        self.calls += 1
        return self.compiled


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{cc.SUFFIX}"))


def child(code: str, cache_dir: Path, timeout: float = 300) -> str:
    """Run `code` in a new Python process (this checkout's foxcute) on the cache folder."""
    env = {**os.environ, "FOXCUTE_CACHE_DIR": str(cache_dir.parent), "CUTE_DSL_ARCH": "sm_90a",
           "PYTHONPATH": str(REPO)}
    env.pop("FOXCUTE_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# --- the key ------------------------------------------------------------------------------

def test_key_changes_with_each_component_and_not_otherwise():
    env = cc.environment()
    digest, fields = cc.entry_header(MODULE, KEY, env)
    assert cc.entry_header(MODULE, KEY, dict(env)) == (digest, fields)
    assert cc.entry_header(MODULE, KEY) == (digest, fields)  # environment() is that env
    changed = {"format": cc.FORMAT_VERSION + 1, "source": "0" * 64, "dsl": "4.8.2", "cuda": "cu12",
               "arch": "sm_100a", "host": "aarch64", "options": "--opt-level 2",
               "dsl_env": {"CUTE_DSL_LINEINFO": "1"}}
    assert set(changed) == set(env)  # every environment field is varied below
    for field, value in changed.items():
        assert cc.entry_header(MODULE, KEY, {**env, field: value})[0] != digest, field
    assert cc.entry_header(MODULE, (3, False, True), env)[0] != digest
    assert cc.entry_header(MODULE, (4, False, False), env)[0] != digest
    assert cc.entry_header("foxcute.kernels.q_denoise", KEY, env)[0] != digest


def test_key_is_the_same_in_a_new_process(cache):
    """No process-dependent text (hash seeds, addresses) in the digest."""
    out = child(f"""
        from foxcute.kernels import _compile_cache, column_sum
        print(_compile_cache.entry_header({MODULE!r}, {KEY!r})[0])
    """, cache)
    assert out.split()[-1] == cc.entry_header(MODULE, KEY)[0]


def test_module_source_is_in_the_key(tmp_path, monkeypatch):
    module = tmp_path / "kernel_module_for_the_key_test.py"
    module.write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import kernel_module_for_the_key_test  # noqa: F401

    cc.module_fingerprint.cache_clear()
    before = cc.entry_header("kernel_module_for_the_key_test", KEY)[0]
    module.write_text("X = 2\n")
    cc.module_fingerprint.cache_clear()
    assert cc.entry_header("kernel_module_for_the_key_test", KEY)[0] != before
    cc.module_fingerprint.cache_clear()


def test_environment_follows_the_dsl_variables(monkeypatch):
    base = cc.environment()
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_100a")
    assert cc.environment()["arch"] == "sm_100a"
    monkeypatch.setenv("CUTE_DSL_ARCH", base["arch"])
    monkeypatch.setenv("CUTE_DSL_LINEINFO", "1")
    assert cc.environment()["dsl_env"] == {**base["dsl_env"], "CUTE_DSL_LINEINFO": "1"}
    monkeypatch.delenv("CUTE_DSL_LINEINFO")
    monkeypatch.setenv("CUTE_DSL_DUMP_DIR", "/somewhere/else")  # an output folder, not code
    assert cc.environment() == base


def test_source_fingerprint_covers_every_kernel_file_and_not_the_location(tmp_path, monkeypatch):
    package = tmp_path / "foxcute"
    shutil.copytree(cc.KERNELS_DIR, package / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    for name in cc.SOURCE_FILES:
        shutil.copy(cc.KERNELS_DIR.parent / name, package / name)
    real = cc.source_fingerprint()
    monkeypatch.setattr(cc, "KERNELS_DIR", package / "kernels")
    cc.source_fingerprint.cache_clear()
    try:
        assert cc.source_fingerprint() == real  # same files elsewhere: same fingerprint
        for edited in (package / "kernels" / "mamba2" / "__init__.py", package / cc.SOURCE_FILES[0]):
            original = edited.read_bytes()
            edited.write_bytes(original + b"# edited\n")
            cc.source_fingerprint.cache_clear()
            assert cc.source_fingerprint() != real, edited
            edited.write_bytes(original)
        (package / "kernels" / "new_kernel.py").write_text("")
        cc.source_fingerprint.cache_clear()
        assert cc.source_fingerprint() != real
    finally:
        cc.source_fingerprint.cache_clear()


def test_kernels_import_nothing_from_foxcute_outside_the_fingerprint():
    """The source fingerprint is complete: every foxcute module a kernel file imports is under
    foxcute/kernels or in SOURCE_FILES."""
    package = cc.KERNELS_DIR.parent
    outside = set()
    for path in cc.KERNELS_DIR.rglob("*.py"):
        here = path.relative_to(package.parent).with_suffix("").parts  # ("foxcute", "kernels", ...)
        if path.name == "__init__.py":
            here = here[:-1] + ("__init__",)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = here[:len(here) - node.level] if node.level else ()
                targets = [base + tuple(node.module.split(".")) if node.module else base + (alias.name,)
                           for alias in node.names]
            elif isinstance(node, ast.Import):
                targets = [tuple(alias.name.split(".")) for alias in node.names]
            else:
                continue
            for target in targets:
                if target[:1] == ("foxcute",) and target[:2] != ("foxcute", "kernels"):
                    outside.add("/".join(target[1:]) + ".py")
    assert outside and outside <= set(cc.SOURCE_FILES), outside


def test_key_parts_must_have_a_stable_text():
    assert cc.canonical_key(("matmul", 3, 1.5, True, None, (("a", 1),))) == ["matmul", 3, 1.5, True, None,
                                                                            [["a", 1]]]
    for bad in (object(), _cute.CompiledCache, {"a": 1}):
        with pytest.raises(TypeError):
            cc.canonical_key((1, bad))


# --- storing and loading ------------------------------------------------------------------

def test_a_compile_is_stored_then_loaded_and_kept_compiles_bypass_the_disk(cache, compiled):
    build = Builds(compiled)
    assert _cute.CompiledCache(MODULE).get(KEY, build) is compiled
    assert build.calls == 1 and len(entries(cache)) == 1
    loaded = _cute.CompiledCache(MODULE).get(KEY, build)  # a new process's cache, in effect
    assert build.calls == 1 and loaded is not compiled and loaded.load_from_binary
    assert str(loaded.execution_args.signature) == str(compiled.execution_args.signature)

    kept = _cute.CompiledCache(MODULE).get((3, True, False), lambda: _cute.compile_kernel(
        column_sum._config(3), *column_sum.compile_args(), keep=True))
    assert ".target sm_90a" in kept.__ptx__ and len(entries(cache)) == 1


def test_a_new_process_loads_a_real_kernel_instead_of_compiling(cache):
    """column_sum N=3 compiled and stored by one process, loaded by the next: same class and
    signature as cute.compile's, and cute.compile not called."""
    code = """
        import time
        import cutlass.cute as cute
        from foxcute.kernels import column_sum
        calls = []
        compile_fn = cute.compile
        cute.compile = lambda *a, **k: calls.append(1) or compile_fn(*a, **k)
        start = time.perf_counter()
        fn = column_sum._compile(3)
        print(len(calls), type(fn).__name__, fn.load_from_binary, time.perf_counter() - start)
        print(fn.execution_args.signature)
    """
    first = child(code, cache).splitlines()
    second = child(code, cache).splitlines()
    assert first[0].split()[:3] == ["1", "CudaDialectJitCompiledFunction", "False"]
    assert second[0].split()[:3] == ["0", "CudaDialectJitCompiledFunction", "True"]
    assert first[1] == second[1]
    print(f"column_sum N=3 in a new process: compiled and stored in {float(first[0].split()[3]):.3f} s, "
          f"loaded in {float(second[0].split()[3]):.3f} s")
    assert len(entries(cache)) == 1


def test_cache_off_and_cache_dir_honoured(tmp_path, monkeypatch, compiled):
    monkeypatch.setenv("FOXCUTE_CACHE_DIR", str(tmp_path / "chosen"))
    monkeypatch.setenv("FOXCUTE_CACHE", "0")
    build = Builds(compiled)
    _cute.CompiledCache(MODULE).get(KEY, build)
    _cute.CompiledCache(MODULE).get(KEY, build)
    assert build.calls == 2 and not (tmp_path / "chosen").exists()
    monkeypatch.setenv("FOXCUTE_CACHE", "1")
    _cute.CompiledCache(MODULE).get(KEY, build)
    assert len(entries(tmp_path / "chosen" / "kernels")) == 1


def test_default_location(tmp_path, monkeypatch):
    monkeypatch.delenv("FOXCUTE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cc.cache_dir() == tmp_path / "xdg" / "foxcute" / "kernels"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cc.cache_dir() == tmp_path / "home" / ".cache" / "foxcute" / "kernels"


# --- unusable entries ---------------------------------------------------------------------

def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1000])


def _stale_header(path: Path) -> None:  # an entry of another DSL version under this name
    header, obj = path.read_bytes().split(b"\n", 1)
    fields = json.loads(header)
    fields["dsl"] = "4.7.0"
    path.write_bytes(json.dumps(fields).encode() + b"\n" + obj)


def _garbage_object(path: Path) -> None:  # intact by its digest, but no object file
    header, obj = path.read_bytes().split(b"\n", 1)
    fields = json.loads(header)
    junk = b"\x7fELF" + bytes(len(obj) - 4)
    fields["object_sha256"] = hashlib.sha256(junk).hexdigest()
    path.write_bytes(json.dumps(fields).encode() + b"\n" + junk)


def _not_json(path: Path) -> None:
    path.write_bytes(b"\x00" * 100)


@pytest.mark.parametrize("damage", [_flip_last_byte, _truncate, _stale_header, _garbage_object, _not_json])
def test_an_unusable_entry_is_deleted_with_a_warning_and_rebuilt(cache, compiled, damage):
    build = Builds(compiled)
    _cute.CompiledCache(MODULE).get(KEY, build)
    (path,) = entries(cache)
    damage(path)
    with pytest.warns(cc.CompileCacheWarning, match="deleted"):
        rebuilt = _cute.CompiledCache(MODULE).get(KEY, build)
    assert rebuilt is compiled and build.calls == 2
    assert entries(cache) == [path]  # written again, whole
    assert _cute.CompiledCache(MODULE).get(KEY, build).load_from_binary and build.calls == 2


def test_a_failed_store_warns_and_the_kernel_still_comes_back(tmp_path, monkeypatch, compiled):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.delenv("FOXCUTE_CACHE", raising=False)
    monkeypatch.setenv("FOXCUTE_CACHE_DIR", str(blocker / "cache"))  # cannot be created
    with pytest.warns(cc.CompileCacheWarning) as warned:
        assert _cute.CompiledCache(MODULE).get(KEY, Builds(compiled)) is compiled
    assert [str(w.message).split(" ")[3:5] for w in warned] == [["could", "not"]] * 2  # read, store



# --- atomic and concurrent writes ---------------------------------------------------------

class FakeCompiled:
    """What store needs of a compiled function: an object file (here any bytes)."""

    def __init__(self, payload: bytes):
        self.payload = payload

    def dump_to_object(self, prefix: str) -> bytes:
        return self.payload


def _entry_is_whole(path: Path) -> bool:
    header, obj = path.read_bytes().split(b"\n", 1)
    fields = json.loads(header)
    return fields["object_bytes"] == len(obj) and fields["object_sha256"] == hashlib.sha256(obj).hexdigest()


@pytest.mark.parametrize("crash_at", ["write", "replace"])
def test_a_writer_that_dies_mid_write_leaves_the_old_entry_or_none(cache, crash_at):
    """A process killed while writing an entry (half the file written, or all of it but not
    yet renamed) leaves no partial entry: readers see the previous entry, or none."""
    code = f"""
        import os, sys
        from foxcute.kernels import _compile_cache as cc, column_sum

        class Fake:
            def dump_to_object(self, prefix):
                return bytes(range(256)) * 4096 + sys.argv[-1].encode()

        real_fdopen = os.fdopen
        if {crash_at!r} == "write":
            class Dying:
                def __init__(self, f):
                    self.f = f
                def __enter__(self):
                    return self
                def __exit__(self, *exc):
                    return False
                def write(self, data):  # the header whole, then half the object
                    if len(data) < 100000:
                        return self.f.write(data)
                    self.f.write(data[:len(data) // 2])
                    self.f.flush()
                    os._exit(3)
            os.fdopen = lambda *a, **k: Dying(real_fdopen(*a, **k))
        else:
            os.replace = lambda *a: os._exit(3)
        cc.store({MODULE!r}, {KEY!r}, Fake())
    """
    env = {**os.environ, "FOXCUTE_CACHE_DIR": str(cache.parent), "PYTHONPATH": str(REPO)}
    dies = [sys.executable, "-c", textwrap.dedent(code)]
    assert subprocess.run(dies, env=env, cwd=REPO).returncode == 3
    assert entries(cache) == [] and cc.load(MODULE, KEY) is None  # no entry, no warning

    cc.store(MODULE, KEY, FakeCompiled(b"the old entry"))
    (path,) = entries(cache)
    before = path.read_bytes()
    assert subprocess.run(dies, env=env, cwd=REPO).returncode == 3
    assert entries(cache) == [path] and path.read_bytes() == before
    leftovers = [p for p in cache.iterdir() if p.suffix == ".tmp"]
    assert len(leftovers) == 2  # the dead writers' temporary files, which clear removes
    assert cc.clear() == 1 and list(cache.iterdir()) == []


def test_concurrent_writers_never_show_a_partial_entry(cache):
    """Two processes rewrite one 4 MB entry 30 times each while this one reads it: every read
    finds the whole of one writer's entry; one entry and no temporary file remain."""
    code = """
        import sys
        from foxcute.kernels import _compile_cache as cc, column_sum

        class Fake:
            def __init__(self, payload):
                self.payload = payload
            def dump_to_object(self, prefix):
                return self.payload

        for i in range(30):
            cc.store(%r, %r, Fake(bytes([i, int(sys.argv[-1])]) * (2 << 20)))
    """ % (MODULE, KEY)
    env = {**os.environ, "FOXCUTE_CACHE_DIR": str(cache.parent), "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(w)], env=env, cwd=REPO)
               for w in (1, 2)]
    path = cc.entry_path(cache, cc.entry_header(MODULE, KEY)[0])
    reads = 0
    while any(w.poll() is None for w in writers):
        try:
            assert _entry_is_whole(path)
            reads += 1
        except FileNotFoundError:
            pass
    assert [w.returncode for w in writers] == [0, 0]
    assert entries(cache) == [path] and _entry_is_whole(path)
    assert [p for p in cache.iterdir() if p != path] == []
    assert reads > 0


def test_two_processes_compiling_one_kernel_leave_one_valid_entry(cache):
    code = """
        from foxcute.kernels import column_sum
        column_sum._compile(3)
    """
    env = {**os.environ, "FOXCUTE_CACHE_DIR": str(cache.parent), "CUTE_DSL_ARCH": "sm_90a", "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=REPO) for _ in range(2)]
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    (path,) = entries(cache)
    assert [p for p in cache.iterdir() if p != path] == []
    loaded = cc.load(MODULE, KEY)
    assert loaded is not None and loaded.load_from_binary


# --- command line -------------------------------------------------------------------------

def test_cache_info_and_clear_command_line(cache, compiled, capsys):
    assert cli.main(["cache", "info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info == {"dir": str(cache), "enabled": True, "entries": 0, "bytes": 0, "dsl": cc.dsl_version()}
    _cute.CompiledCache(MODULE).get(KEY, Builds(compiled))
    _cute.CompiledCache(MODULE).get((5, False, False), Builds(compiled))
    assert cli.main(["cache", "info"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 2 and info["bytes"] == sum(p.stat().st_size for p in entries(cache)) > 0
    assert cli.main(["cache", "clear"]) == 0
    assert capsys.readouterr().out.startswith("removed 2 entries")
    assert entries(cache) == []
