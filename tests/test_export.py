"""`foxcute export` without a GPU (issue 33): the export runs at the trainer's sizes, its
manifest and header say what was compiled in, the C test program compiles and links against
the library with the system compiler, and every argument check that precedes a CUDA call gives
its documented status code (run on the CPU: the checks return before CUDA is touched)."""

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from foxcute import cli, export
from foxcute.export import toolchain
from foxcute.lab import c_export
from foxcute.step import StepSizes

TESTS = Path(__file__).resolve().parent
PASS_KERNELS = {"column_sum": ["column_sum_n3", "column_sum_n128"],
                "q_denoise_loss_and_grads": ["q_denoise_spread", "q_denoise_two_level"],
                "risk_budget_forward": ["risk_budget"], "kan_forward": ["kan_forward"],
                "kan_backward": ["kan_backward_spread", "kan_backward_two_level"],
                "curiosity_forward_backward": ["curiosity_weight_prep", "curiosity_row_pass", "curiosity_sums_n769",
                                               "curiosity_weight_grads"],
                "mamba2_forward": ["mamba2_forward"], "mamba2_backward": ["mamba2_backward", "mamba2_sums_n12548"]}

pytestmark = pytest.mark.skipif(toolchain.cuda_root() is None or shutil.which("cc") is None,
                                reason="no C compiler, or no CUDA runtime headers and libcudart_static.a "
                                       "(CUDA_HOME, /usr/local/cuda or the nvidia-cuda-runtime wheel)")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The export at the trainer's sizes, through the command line."""
    out = tmp_path_factory.mktemp("export")
    assert cli.main(["export", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def test_program(exported):
    exe = exported / "foxcute_test"
    assert toolchain.compile_program(TESTS / "c" / "foxcute_test.c", exe, exported) == ""  # no warnings
    return exe


def test_manifest_names_what_was_compiled(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    assert {p: [k["kernel"] for k in ks] for p, ks in manifest["passes"].items()} == PASS_KERNELS
    assert manifest["passes"]["risk_budget_forward"][0] == {
        "kernel": "risk_budget", "symbol_prefix": "fxk_risk_budget", "SH2": 256, "I": 16, "H": 64,
        "precision": "tf32"}
    assert (manifest["arch"], manifest["precision"], manifest["sizes"]["A_q"]) == ("sm_90a", "tf32", 12)
    assert manifest["dsl_version"] == importlib.metadata.version("nvidia-cutlass-dsl")
    assert manifest["source_fingerprint"] == toolchain.source_fingerprint()
    assert manifest["library"]["sha256"] == toolchain.sha256(exported / "libfoxcute.a")
    assert manifest["header"]["sha256"] == toolchain.sha256(exported / "foxcute.h")
    assert manifest["launch_code_warnings"] == ""  # the system compiler's, on c/foxcute.c


def test_header_states_the_compiled_sizes(exported):
    header = (exported / "foxcute.h").read_text()
    defines = dict(re.findall(r"#define (FOXCUTE_\w+) (.+?)\s*(?:/\*.*)?$", header, re.M))
    assert defines["FOXCUTE_COLUMN_SUM_WIDTHS"] == "{3, 128}"
    assert defines["FOXCUTE_PRECISION"] == '"tf32"'
    # dW1 [24, 12] | db1 [24] | dW2 [12, 24] | db2 [12] | loss, as the Python path slices them
    assert [int(defines[f"FOXCUTE_Q_DENOISE_{k}"]) for k in ("DW1", "DB1", "DW2", "DB2", "LOSS", "GRADS")] == \
        [0, 288, 312, 600, 612, 613]
    # dC [32, 256] | dWb [32, 32] (kan.output_layout: dWb at a multiple of 4)
    assert [int(defines[f"FOXCUTE_KAN_{k}"]) for k in ("I", "O", "G", "DC", "DWB", "GRADS")] == \
        [32, 32, 8, 0, 8192, 9216]
    # db2 [256] | db1 [128] | dW1's action columns [128, 3] | loss
    assert [int(defines[f"FOXCUTE_CURIOSITY_{k}"]) for k in ("F", "H", "A", "DB1", "DW1A", "LOSS", "SUMS")] == \
        [256, 128, 3, 256, 384, 768, 769]
    # dW_A | dW_B | dW_C [256, 16] | dw [256] | dsigma, padded to whole float4 vectors
    assert [int(defines[f"FOXCUTE_MAMBA2_{k}"]) for k in ("K", "SH2", "D", "DW_B", "DW_C", "DW", "DSIGMA", "GRADS")] \
        == [8, 256, 16, 4096, 8192, 12288, 12544, 12548]
    codes = [int(defines[k]) for k in defines if k.startswith("FOXCUTE_ERR_") or k == "FOXCUTE_OK"]
    assert len(codes) == len(set(codes)) == 8


def test_library_holds_every_kernel_the_launch_code_and_the_dsl_runtime(exported):
    symbols = subprocess.run(["nm", "--defined-only", str(exported / "libfoxcute.a")], capture_output=True,
                             text=True, check=True).stdout
    defined = {line.split()[-1] for line in symbols.splitlines() if len(line.split()) == 3}
    for kernel in sum(PASS_KERNELS.values(), []):
        assert f"_mlir_fxk_{kernel}_cuda_init" in defined
    assert {"foxcute_load", "foxcute_column_sum", "foxcute_q_denoise_loss_and_grads",
            "foxcute_risk_budget_forward", "foxcute_kan_forward", "foxcute_kan_backward",
            "foxcute_curiosity_forward_backward", "foxcute_mamba2_forward", "foxcute_mamba2_backward",
            "_cudaLaunchKernelEx"} <= defined


def test_c_program_compiles_and_links(test_program):
    assert test_program.is_file()


def test_argument_checks_return_their_codes_before_any_cuda_call(test_program):
    done = subprocess.run([str(test_program), "validate"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "validate: 0 failure(s)"


def test_bench_harness_compiles_links_and_refuses_bad_arguments(exported, tmp_path):
    """foxcute_bench (foxcute/export/c/foxcute_bench.c) against the export, no warnings; its
    argument checks precede foxcute_load, so they run without a GPU."""
    exe = tmp_path / "foxcute_bench"
    assert toolchain.compile_program(c_export.SOURCE, exe, exported) == ""
    usage = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage:" in usage.stderr
    zero = subprocess.run([str(exe), "0", "64", "128", "5", "50", "10"], capture_output=True, text=True, timeout=60)
    assert zero.returncode == 2 and "'0' is not an integer >= 1" in zero.stderr


def test_bench_harness_runs_every_graph_on_a_cpu_stand_in_for_cuda(exported, tmp_path):
    """The harness's control flow without a GPU: linked with tests/c/bench_stub.c (the CUDA
    calls and foxcute's passes on host memory, a graph replaying the outputs its capture
    recorded) instead of the library and cudart, it times every graph in the step's order
    and prints lines lab.c_export parses; a replay that writes nothing fails the check."""
    exe = tmp_path / "bench_stub"
    assert toolchain.run(["cc", "-std=c11", "-O1", "-Wall", "-Wextra", f"-I{exported}",
                          f"-I{toolchain.cuda_root() / 'include'}", str(c_export.SOURCE), str(TESTS / "c" / "bench_stub.c"),
                          "-o", str(exe)]) == ""
    done = subprocess.run([str(exe), "64", "4", "128", "1", "3", "2"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line.split('"')[3] for line in done.stdout.splitlines()] == [
        "mamba2_forward", "curiosity_forward_backward", "risk_budget_forward", "q_denoise_loss_and_grads",
        "column_sum", "column_sum", "kan_forward", "kan_backward", "mamba2_backward", "step"]
    records = c_export.parse(done.stdout, StepSizes(), 64, "tf32")
    assert all("error" not in r and r["time_us"] == 5.0 for r in records)  # 0.01 ms an event pair / 2 replays
    missed = subprocess.run([str(exe), "64", "4", "128", "1", "3", "2"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "NOLAUNCH": "1"})
    assert missed.returncode == 1 and missed.stdout == ""
    assert "mamba2_forward: output 0 [0] is not finite after a replay" in missed.stderr


def test_c_export_records_reuse_the_export_and_turn_failures_into_errors(exported, tmp_path, monkeypatch):
    """The driver reuses the module's export (same sizes, precision and sources: the library is
    not rewritten), and a run or a build that fails gives one record a graph with the error
    and no time, raising nothing."""
    built = (exported / "libfoxcute.a").stat().st_mtime_ns
    ran = c_export.records(exported, StepSizes(), batch=0)  # foxcute_bench refuses B = 0: exit 2
    assert (exported / "libfoxcute.a").stat().st_mtime_ns == built
    assert len(ran) == 10
    assert all(r["time_us"] is None and r["error"].startswith("foxcute_bench exited 2:") for r in ran)
    broken = tmp_path / "broken.c"
    broken.write_text("int main(void) { return missing; }\n")
    monkeypatch.setattr(c_export, "SOURCE", broken)
    failed = c_export.records(exported, StepSizes(), batch=64)
    assert len(failed) == 10
    assert all(r["time_us"] is None and r["error"].startswith("ExportError: cc ") and "missing" in r["error"]
               for r in failed)


# docs/layers.md's odd sizes where a layer has them, others that each kernel module takes
ODD_SIZES = "A=5,H_iqn=127,A_q=5,H_q=7,SH2=128,I_risk=3,H_risk=12,I_kan=5,O_kan=6,G_kan=3,H_c=64,K=4,D=8"


def test_fp32_export_at_odd_sizes_takes_fp32_kernels_and_links(tmp_path):
    """--precision fp32 at odd sizes: every kernel with a precision takes fp32 (the column
    sums have none; KAN's backward is then two kernels and curiosity's weight gradients
    gemm.WeightGrad: the launch code's other branches), the offsets follow the sizes (dWb
    after dC padded to whole float4s), the test program links and its checks hold."""
    assert cli.main(["export", "--out", str(tmp_path), "--precision", "fp32", "--sizes", ODD_SIZES]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert [k["kernel"] for k in manifest["passes"]["kan_backward"]] == ["kan_backward_fp32", "kan_grad_reduce"]
    assert {k["precision"] for p in manifest["passes"].values() for k in p if "precision" in k} == {"fp32"}
    header = (tmp_path / "foxcute.h").read_text()
    for define in ("FOXCUTE_COLUMN_SUM_WIDTHS {5, 127}", "FOXCUTE_Q_DENOISE_DB2 77", "FOXCUTE_KAN_DWB 92",
                   "FOXCUTE_CURIOSITY_SUMS 513", "FOXCUTE_MAMBA2_GRADS 3204"):
        assert f"#define {define}\n" in header
    assert toolchain.compile_program(TESTS / "c" / "foxcute_test.c", tmp_path / "foxcute_test", tmp_path) == ""
    assert manifest["launch_code_warnings"] == ""
    done = subprocess.run([str(tmp_path / "foxcute_test"), "validate"], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "validate: 0 failure(s)", done.stdout + done.stderr


def test_sizes_parse_as_step_sizes():
    assert export.parse_sizes("trainer") == StepSizes()
    assert export.parse_sizes("SH2=128, H_risk=32") == StepSizes(SH2=128, H_risk=32)
    for bad in ("SH3=128", "SH2=big", "SH2=0"):
        with pytest.raises(export.ExportError):
            export.parse_sizes(bad)


@pytest.mark.parametrize("sizes", ["H_risk=130", "A_q=33", "H_iqn=4097", "O_kan=33"])
def test_export_refuses_sizes_the_kernels_do_not_take(tmp_path, sizes, capsys):
    assert cli.main(["export", "--out", str(tmp_path), "--sizes", sizes]) == 2
    assert "foxcute export: error:" in capsys.readouterr().err
    assert not (tmp_path / "libfoxcute.a").exists()


@pytest.mark.skipif(shutil.which("cargo") is None, reason="no cargo on the PATH")
def test_rust_example_builds_links_and_gets_the_checks_codes(exported, tmp_path):
    """examples/rust_trainer: hand-written bindings, a build.rs of link directives, no crates."""
    crate = TESTS.parent / "examples" / "rust_trainer"
    env = {**os.environ, "FOXCUTE_EXPORT_DIR": str(exported), "CARGO_TARGET_DIR": str(tmp_path),
           "CUDA_LIB_DIR": str(toolchain.cuda_libdir(toolchain.cuda_root()))}
    subprocess.run(["cargo", "build", "--offline", "--manifest-path", str(crate / "Cargo.toml")], env=env,
                   check=True, capture_output=True, timeout=300)
    done = subprocess.run([str(tmp_path / "debug" / "foxcute-trainer-example")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "foxcute status 1: null pointer"
