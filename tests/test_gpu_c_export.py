"""The C timing harness on the H200 (issue 33): foxcute.lab.c_export exports the kernels at the
trainer's sizes, builds foxcute_bench and runs it at a small batch; every pass and the step
come back timed (each graph's replay rewrote its NaN-poisoned outputs, or the harness exits
non-zero and the records carry its error). Needs, as tests/test_gpu_export.py: the DSL, `cc`,
and the CUDA headers with libcudart_static.a."""

import pytest

from foxcute.lab import c_export
from foxcute.step import StepSizes

pytestmark = pytest.mark.gpu


def test_every_pass_and_the_step_are_timed():
    records = c_export.records(None, StepSizes(), batch=256, warmup=2, reps=5, calls_per_rep=3)
    assert [r for r in records if "error" in r] == []
    assert len(records) == 10  # 8 passes (two column sums) and the step
    assert all(r["time_us"] > 0 and r["time_us_p10"] <= r["time_us"] <= r["time_us_p90"] for r in records)
    assert [r["impl"] for r in records] == ["c_export"] * 9 + ["c_export_graph"]
