"""foxcute.lab.c_export without a GPU: the harness's output parsed into the profiling
notebook's records, with layer, pass and params as the Python records of the same pass name
them (so that a reader sets them side by side), and failures as records with an error.
Building and running the harness against an export: tests/test_export.py (it has the export);
on the GPU: tests/test_gpu_c_export.py."""

import pytest

from foxcute.lab import benchmarks, breakdown, c_export, timing
from foxcute.step import StepSizes

SIZES = StepSizes()
CANNED = "\n".join([
    '{"pass": "mamba2_forward", "B": 64, "samples_us": [3.0, 1.0, 2.0, 4.0, 5.0]}',
    "a line that is not JSON",
    '{"pass": "column_sum", "N": 3, "B": 64, "samples_us": [7.5]}',
    '{"pass": "column_sum", "N": 128, "B": 64, "samples_us": [9.0, 11.0]}',
    '{"pass": "step", "B": 64, "samples_us": [100.0, 120.0, 110.0]}',
]) + "\n"


def by_key(records):
    return {(r["layer"], r["pass"], r["params"].get("variant")): r for r in records}


def test_canned_output_becomes_records_with_the_spread_of_the_samples():
    records = c_export.parse(CANNED, SIZES, 64, "tf32")
    assert len(records) == len(c_export.expected(SIZES)) == 10  # 8 passes, N = 3 and 128, the step
    found = by_key(records)
    m2 = found["mamba2", "forward", None]
    assert (m2["impl"], m2["params"], m2["timing"]) == ("c_export", dict(B=64, K=8, SH2=256, D=16), "CUDA graph replay")
    assert {k: m2[k] for k in ("time_us", "time_us_p10", "time_us_p90")} == timing.spread([3.0, 1.0, 2.0, 4.0, 5.0])
    assert m2["time_us"] == 3.0 and "error" not in m2
    assert found["column_sum", "forward", "N=3"]["time_us"] == 7.5
    assert found["column_sum", "forward", "N=128"]["time_us"] == 10.0
    step = found["step", "step", None]
    assert (step["impl"], step["time_us"], step["params"]["precision"]) == ("c_export_graph", 110.0, "tf32")
    missing = [r for r in records if r["time_us"] is None]
    assert {(r["layer"], r["pass"]) for r in missing} == {
        ("curiosity", "forward_backward"), ("risk_budget", "forward"), ("q_denoise", "loss_and_grads"),
        ("kan", "forward"), ("kan", "backward"), ("mamba2", "backward")}
    assert all(r["error"] == "foxcute_bench printed no samples for it" for r in missing)


def test_params_are_the_python_records_params():
    """Each pass's params equal its benchmarks.CASES case's at the same batch (the cute
    records'), the step's breakdown.step_records'."""
    records = by_key(c_export.parse(CANNED, SIZES, 512, "tf32"))
    for case in benchmarks.CASES:
        python = {**case.scaled(512), **({"variant": case.label} if case.label else {})}
        assert records[case.layer, case.pass_, python.get("variant")]["params"] == python, case.name
    step_python = breakdown._record("cute", StepSizes(B=512), "tf32")["params"]
    assert records["step", "step", None]["params"] == step_python


def test_a_failed_run_puts_its_error_on_every_record_without_samples():
    error = "foxcute_bench exited 1: foxcute_bench: foxcute_load: status 1035"
    records = c_export.parse("", SIZES, 64, "tf32", error)
    assert all(r["time_us"] is None and r["error"] == error for r in records)
    only_step_missing = "".join(f'{{"pass": "{p}", ' + (f'"N": {n}, ' if n else "") + '"samples_us": [1.0]}\n'
                                for p, n in c_export.expected(SIZES) if p != "step")
    records = c_export.parse(only_step_missing, SIZES, 64, "tf32", error)
    assert [r["error"] for r in records if "error" in r] == [error] and records[-1]["layer"] == "step"
    every_graph = only_step_missing + '{"pass": "step", "samples_us": [5.0]}\n'
    records = c_export.parse(every_graph, SIZES, 64, "tf32", error)  # it failed after the last graph
    assert all(r["time_us"] is not None for r in records)
    assert [r["error"] for r in records if "error" in r] == [error] and records[-1]["layer"] == "step"


@pytest.mark.parametrize("H_iqn, widths", [(3, [3]), (128, [3, 128])])
def test_one_column_sum_record_a_width(H_iqn, widths):
    assert [n for p, n in c_export.expected(StepSizes(H_iqn=H_iqn)) if p == "column_sum"] == widths


def test_beside_sets_each_c_record_by_its_python_counterparts():
    c_records = c_export.parse(CANNED, SIZES, 64, "tf32")
    python = [{"layer": "mamba2", "pass": "forward", "impl": "cute_fused", "params": dict(B=64, K=8, SH2=256, D=16),
               "time_us": 2.5},
              {"layer": "mamba2", "pass": "forward", "impl": "cute_fused", "params": dict(B=128, K=8, SH2=256, D=16),
               "time_us": 1.0},  # another batch: not its counterpart
              {"layer": "column_sum", "pass": "forward", "impl": "cute",
               "params": dict(B=64, Q=64, N=3, variant="N=3"), "time_us": 7.5},
              {"layer": "step", "pass": "step", "impl": "cute_one_stream",
               "params": breakdown._record("cute", StepSizes(B=64), "tf32")["params"], "time_us": 100.0},
              {"layer": "step", "pass": "step", "impl": "cute", "params": {}, "time_us": None, "error": "failed"}]
    rows = {(r["pass"], r["cute impl"]): r for r in c_export.beside(c_records, python)}
    assert len(rows) == 11  # one a pass record, two for the step
    assert rows["mamba2.forward", "cute_fused"]["ratio"] == 3.0 / 2.5
    assert rows["column_sum.forward[N=3]", "cute"]["ratio"] == 1.0
    assert rows["step.step", "cute_one_stream"]["ratio"] == 1.1
    assert rows["step.step", "cute"]["ratio"] is None and rows["kan.backward", "cute"]["cute us"] is None
    sentence = c_export.reading(list(rows.values()))
    assert sentence.startswith("C / cute runs from 1x (column_sum.forward[N=3] / cute) to 1.2x "
                               "(mamba2.forward / cute_fused) over 3 pairs; past the 1.05x target: ")
    assert "step.step / cute_one_stream" in sentence and "column_sum" not in sentence.split("target:")[1]
    assert c_export.reading([]).startswith("No C time")
