"""foxcute.lab.figures on small synthetic tables: each function draws a figure, writes a PNG
where asked, states numbers that follow from its table, and takes empty, NaN and one-row
tables."""
import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from foxcute.lab import figures  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def roofline_records():
    rows = [  # copy 2 TB/s, so intensity 1 FLOP/B has a 2 TFLOP/s roof
        ("a", "forward", "", "cute_fused", 1.0, 1e6, 1e6),  # 1 TFLOP/s: 50% of its roof
        ("a", "forward", "", "cute_seed", 2.5, 1e6, 1e6),  # 0.4 TFLOP/s: 20%
        ("b", "backward", "N=3", "naive", 10.0, 1e6, 1e8),  # intensity 100: right of the FP32 ridge (25)
        ("a", "forward", np.nan, "torch_eager", np.nan, 1e6, 1e6),  # no time: left out
        ("step", "step", "", "cute", 247.0, 0, 0),  # no intensity: left out
    ]
    return pd.DataFrame(rows, columns=["layer", "pass", "label", "impl", "time_us", "bytes_moved", "flops"])


def before_after_records():
    rows = [
        ("a", "forward", "", "naive", 100.0, 5.0), ("a", "forward", "", "cute_fused", 20.0, 5.0),
        ("a", "forward", "", "cute_seed", 10.0, 5.0), ("a", "forward", "", "torch_compile", 30.0, 5.0),
        ("a", "forward", "", "torch_max_autotune", 15.0, 5.0),
        ("a", "forward", "", "torch_compile_cudagraphs", 40.0, 5.0), ("a", "forward", "", "torch_eager", 90.0, 5.0),
        ("b", "backward", "", "naive", 50.0, 5.0), ("b", "backward", "", "cute", 25.0, 5.0),
        ("b", "backward", "", "torch_compile", 20.0, 5.0), ("b", "backward", "", "cute_seed", np.nan, 5.0),
        ("c", "forward", "", "naive", np.nan, 1.0),  # nothing timed: no bars
    ]
    return pd.DataFrame(rows, columns=["layer", "pass", "label", "impl", "time_us", "floor_us"])


def timeline_events():
    rows = [("main", "FusedBackward", 1000.0, 10.0), ("main", "QDenoise", 1010.0, 20.0),
            ("side", "Curiosity", 1005.0, 10.0), ("side", "Risk", 1020.0, np.nan)]
    return pd.DataFrame(rows, columns=["lane", "name", "start_us", "duration_us"])


def sweep_table():
    rows = []
    for B in (1, 64, 512):
        floor = B * 0.01
        rows += [("wins_from_64", "cute", B, 5.0 if B == 1 else 2.0 * B * 0.01 + 1, floor),
                 ("wins_from_64", "torch_compile", B, 3.0 if B == 1 else 4.0 * B * 0.01 + 2, floor),
                 ("loses_at_end", "cute_fused", B, 10.0 * B, floor),
                 ("loses_at_end", "torch_max_autotune", B, 1.0 * B, floor),
                 ("no_torch", "cute", B, 2.0 * B, floor)]
    return pd.DataFrame(rows, columns=["case", "impl", "B", "time_us", "floor_us"])


def error_table():
    rows = [("q", "dW1", "tf32", 1e-3, 4e-3, 2e-3), ("q", "loss", "tf32", 0.0, 0.0, 2e-3),
            ("k", "y", "tf32", 3e-3, np.inf, 2e-3), ("k", "y", "fp32", np.nan, 2e-7, 1e-5)]
    return pd.DataFrame(rows, columns=["case", "output", "precision", "rel_err", "elem_err", "tolerance"])


def curve_table():
    rows = [(setup, step, curve, value + (0.01 * step if setup == "foxcute" else 0.0))
            for setup in ("torch_fp32", "foxcute") for step in range(5)
            for curve, value in (("loss", 1.0 - 0.1 * step), ("td_error", 0.5))]
    return pd.DataFrame(rows, columns=["setup", "step", "curve", "value"])


def step_time_table():
    rows = [("torch_eager", 9000.0, "plain calls"), ("torch_compile", 3000.0, "CUDA graph replay"),
            ("foxcute", 7000.0, "plain calls"), ("foxcute_graph", 1500.0, "CUDA graph replay")]
    return pd.DataFrame(rows, columns=["impl", "time_us", "timing"])


CALLS = {
    "roofline": (lambda t, **kw: figures.roofline(t, 2.0, 400.0, 50.0, **kw), roofline_records),
    "before_after": (figures.before_after, before_after_records),
    "lane_timeline": (figures.lane_timeline, timeline_events),
    "batch_sweep": (figures.batch_sweep, sweep_table),
    "error_vs_tolerance": (figures.error_vs_tolerance, error_table),
    "training_curves": (figures.training_curves, curve_table),
    "step_times": (figures.step_times, step_time_table),
}


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def texts(fig):
    return [t.get_text() for ax in fig.axes for t in ax.texts]


@pytest.mark.parametrize("name", CALLS)
def test_draws_and_saves_a_png(name, tmp_path):
    draw, table = CALLS[name]
    fig, sentence = draw(table(), path=tmp_path / f"{name}.png")
    assert isinstance(fig, Figure) and fig.axes
    assert isinstance(sentence, str) and sentence.endswith(".") and "nan" not in sentence
    assert (tmp_path / f"{name}.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("name", CALLS)
def test_saves_nothing_without_a_path(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    draw, table = CALLS[name]
    draw(table())
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.parametrize("empty", ["no columns", "no rows", "only NaN"])
def test_empty_tables_give_a_no_data_figure(name, empty, tmp_path):
    draw, table = CALLS[name]
    full = table()
    frame = {"no columns": pd.DataFrame(), "no rows": full.iloc[:0],
             "only NaN": full.assign(**{c: np.nan for c in full.select_dtypes("number").columns})}[empty]
    fig, sentence = draw(frame, path=tmp_path / "empty.png")
    assert any(t.startswith("no data") for t in texts(fig))
    assert sentence.startswith("No ")
    assert (tmp_path / "empty.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize("name", CALLS)
def test_a_single_row(name):
    draw, table = CALLS[name]
    fig, sentence = draw(table().iloc[:1])
    assert not any(t.startswith("no data") for t in texts(fig))
    assert sentence.endswith(".")


@pytest.mark.parametrize("name", CALLS)
def test_a_table_without_a_needed_column_is_refused(name):
    draw, table = CALLS[name]
    frame = table()
    with pytest.raises(ValueError, match="lacks the column"):
        draw(frame.drop(columns=frame.columns[-1]))


def test_roofline_points_roofs_and_sentence():
    fig, sentence = figures.roofline(roofline_records(), 2.0, 400.0, 50.0)
    ax = fig.axes[0]
    points = np.concatenate([c.get_offsets() for c in ax.collections])
    assert len(points) == 3  # the NaN time and the zero-byte step are left out
    assert sorted(points[:, 1].tolist()) == pytest.approx([0.4, 1.0, 10.0])
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert {"a.forward", "b.backward[N=3]"} == {t for t in texts(fig) if not t.endswith("FLOP/B")}
    labels = ax.get_legend_handles_labels()[1]
    assert any("2 TB/s" in s for s in labels) and any("400 TFLOP/s" in s for s in labels)
    assert any("50 TFLOP/s" in s for s in labels)
    assert sentence.startswith("2 of 3 points lie left of the FP32 ridge (25 FLOP/B)")
    assert "cute_fused on a.forward, reaches 50% of its roof and the median CuTe point 35%" in sentence


def test_before_after_groups_bars_and_sentence():
    fig, sentence = figures.before_after(before_after_records())
    ax = fig.axes[0]
    bars = {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}
    assert bars == {"naive": [100.0, 50.0], "torch eager": [90.0], "best torch.compile": [15.0, 20.0],
                    "best cute": [10.0, 25.0], "floor": [5.0, 5.0]}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a.forward", "b.backward"]
    assert ax.get_yscale() == "log"
    assert sentence == ("Per layer pass, the best CuTe implementation is 2x to 10x (median 6x over 2 passes) "
                        "faster than naive; its time is 2x to 5x (median 3.5x over 2 passes) the floor "
                        "(furthest: b.backward); it beats the best torch.compile on 1 of 2 passes.")


def test_before_after_without_groups_to_compare():
    frame = before_after_records()
    fig, sentence = figures.before_after(frame[frame["impl"] == "torch_eager"])
    assert sentence == "Only torch eager, floor measured: no comparison between groups to draw."


def test_lane_timeline_bars_and_sentence():
    fig, sentence = figures.lane_timeline(timeline_events())
    ax = fig.axes[0]
    assert [(p.get_x(), p.get_width()) for p in ax.patches] == [(0.0, 10.0), (10.0, 20.0), (5.0, 10.0)]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["main", "side"]
    assert set(texts(fig)) <= {"FusedBackward", "QDenoise", "Curiosity"} | {t for t in texts(fig) if t.endswith("…")}
    assert sentence == ("The 3 kernels span 30 us; lane main is busy longest (30 us, 100% of the span) "
                        "and the lanes overlap for 10 us (33% of the span).")


def test_lane_overlap_counts_lanes_not_kernels():
    lanes = {"main": [(0.0, 10.0), (5.0, 12.0)], "side": [(11.0, 20.0)], "third": [(30.0, 31.0)]}
    assert figures._overlap_length(lanes) == pytest.approx(1.0)  # only 11..12 has two lanes busy
    assert figures._union_length(lanes["main"]) == pytest.approx(12.0)


def test_batch_sweep_panels_lines_and_sentence():
    fig, sentence = figures.batch_sweep(sweep_table())
    shown = [ax for ax in fig.axes if ax.axison]
    assert [ax.get_title() for ax in shown] == ["wins_from_64", "loses_at_end", "no_torch"]
    first = shown[0]
    lines = {line.get_label(): line for line in first.get_lines()}
    assert set(lines) == {"cute", "torch_compile", "floor"}
    assert lines["cute"].get_ydata() == pytest.approx([5.0, 2.28 / 64, 11.24 / 512])
    assert lines["floor"].get_ydata() == pytest.approx([0.01] * 3)
    assert first.get_xscale() == first.get_yscale() == "log"
    assert sentence == ("Per case, wins_from_64: CuTe beats torch.compile from B=64 on (CuTe 2.2x the floor at B=512); "
                        "loses_at_end: CuTe still loses to torch.compile at the largest B=512 (CuTe 1000x the floor "
                        "at B=512); no_torch: no torch.compile time (CuTe 200x the floor at B=512).")


def test_error_vs_tolerance_points_lines_and_sentence():
    fig, sentence = figures.error_vs_tolerance(error_table())
    ax = fig.axes[0]
    tolerances = sorted(line.get_ydata()[0] for line in ax.get_lines())
    assert tolerances == pytest.approx([1e-5, 2e-3])
    assert {"0", "inf"} <= set(texts(fig))
    drawn = [c for c in ax.collections if len(c.get_offsets())]
    assert len(drawn) == 7  # four rows, two errors each, one rel_err NaN
    assert sentence == ("2 of 3 outputs are within their tolerance; the largest rel_err is 1.5x its tolerance "
                        "(k: y, tf32); the largest elem_err is infinitely above its tolerance (k: y, tf32).")


def test_error_sentence_counts_precisions_apart():
    frame = error_table().assign(rel_err=[1e-3, 0.0, 3e-3, 1e-6])
    _, sentence = figures.error_vs_tolerance(frame)
    assert sentence.startswith("3 of 4 outputs (each precision counted apart) are within their tolerance")


def test_pass_names_and_families():
    assert figures.pass_name("a", "forward", "N=3") == "a.forward[N=3]"
    assert figures.pass_name("a", "forward", math.nan) == figures.pass_name("a", "forward", "") == "a.forward"
    assert figures.pass_name("step", "step") == "step"
    assert [figures.family(i) for i in ("naive", "torch_eager", "cute_fused", "reference", "torch_ops_graph")] == \
        ["naive", "torch", "cute", "other", "other"]
    assert [figures.is_torch_compile(i) for i in ("torch_compile_cudagraphs", "torch_max_autotune", "torch_eager")] == \
        [True, True, False]


@pytest.mark.parametrize("roofs", [(None, 400.0, 50.0), (2.0, math.nan, 50.0), (2.0, 400.0, 0.0)])
def test_roofline_refuses_a_missing_roof(roofs):
    with pytest.raises(ValueError, match="roofs must be finite and positive"):
        figures.roofline(roofline_records(), *roofs)
