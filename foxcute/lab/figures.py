"""The notebooks' figures: each function takes a results table, draws one matplotlib Figure
and returns it with one sentence saying what to take from it, its numbers computed from the
table (never typed in). Every function accepts ``path=``: when given, the figure is also saved
there as a PNG (120 dpi, tight bounding box). Nothing is shown or closed here: a notebook
displays the returned figure inline.

How to read each figure:

- ``roofline``: arithmetic intensity (FLOP per byte that must move) on x, achieved TFLOP/s on
  y, both logarithmic. The slanted line is the memory roof (the measured copy bandwidth times
  the intensity), the two flat lines the TF32 tensor-core and FP32 compute roofs; a pass can
  at best reach the lower of the roofs above its intensity. Left of a roof's ridge (where the
  slanted line meets it) a pass is memory-bound: its distance below the slanted line is how
  far it is from moving its bytes at copy speed. One point per layer pass and implementation:
  a pass's points share its intensity and its name is written once, above them; the marker
  gives the implementation's family (naive, torch, cute), the colour the implementation.
- ``before_after``: per layer pass, bars of time (log scale, each labelled in us) for the
  naive kernels, torch eager, the best torch.compile variant, the best CuTe implementation and
  the memory floor. Bars that differ by a grid line differ tenfold.
- ``lane_timeline``: the step's kernels as a Gantt chart, one row per lane (stream), time from
  the earliest kernel's start; where rows have bars at the same time, the lanes overlap.
- ``batch_sweep``: one panel per case; time per sample (time / B) against the batch B, both
  logarithmic, a line per implementation and the memory floor per sample (dashed). Small B
  shows fixed costs (launch, dependent round trips), large B the cost per sample; a line that
  flattens onto the floor is at copy speed.
- ``error_vs_tolerance``: per output (and precision) the norm-wise error ``rel_err`` (circle,
  the contract's measure) and the element-wise ``elem_err`` (cross), logarithmic, against each
  precision's tolerance (a horizontal line in the precision's colour). An exact zero is drawn
  at the bottom edge and labelled 0, a non-finite error at the top edge and labelled inf.
- ``training_curves``: one panel per training curve (losses, TD error, mean Q, reward), one
  line per setup against the learner step (the first setup solid, the others dashed): lines
  that lie on top of each other are runs that trained alike.
- ``step_times``: one bar per implementation of a whole training step (forward, backward,
  Adam), log scale, labelled in us and with how it was timed (graph replays or plain calls).

Every function takes an empty table (a figure with a "no data" note and a sentence saying so),
NaN entries (the row is left out of what needs them) and a single row. Rows with non-positive
times, bytes or FLOPs are left out where a logarithm needs them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

FAMILY_MARKERS = {"naive": "s", "torch": "^", "cute": "o", "other": "D"}
BEFORE_AFTER_GROUPS = ("naive", "torch eager", "best torch.compile", "best cute", "floor")
GROUP_COLOURS = {"naive": "tab:red", "torch eager": "tab:orange", "best torch.compile": "tab:purple",
                 "best cute": "tab:green", "floor": "0.55"}
DPI = 120


def family(impl: str) -> str:
    """The implementation family: "naive", "torch" (the torch peers, torch_*), "cute" (cute*)
    or "other" (e.g. torch_ops*: foxcute's kernels through its PyTorch operators)."""
    impl = str(impl)
    if impl == "naive":
        return "naive"
    if impl.startswith("torch_ops"):
        return "other"
    if impl.startswith("torch"):
        return "torch"
    if impl.startswith("cute"):
        return "cute"
    return "other"


def is_torch_compile(impl: str) -> bool:
    """Whether an implementation is one of torch.compile's (the "best torch.compile" group)."""
    return str(impl).startswith("torch_compile") or impl == "torch_max_autotune"


def pass_name(layer, pass_, label=None) -> str:
    """"layer.pass" with "[label]" appended where the row has a label (not "" or NaN)."""
    name = f"{layer}.{pass_}" if str(pass_) != str(layer) else str(layer)
    if label is None or (isinstance(label, float) and math.isnan(label)) or str(label) == "":
        return name
    return f"{name}[{label}]"


def _save(fig: Figure, path) -> None:
    if path is not None:
        fig.savefig(Path(path), dpi=DPI, bbox_inches="tight")


def _no_data(title: str, what: str, path) -> tuple[Figure, str]:
    fig, ax = plt.subplots(figsize=(6, 2.5))
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, f"no data: {what}", ha="center", va="center", fontsize=12, transform=ax.transAxes)
    _save(fig, path)
    return fig, f"No {what} to show: the table is empty."


def _numeric(frame: pd.DataFrame, columns) -> pd.DataFrame:
    frame = frame.copy()
    for column in columns:
        frame[column] = pd.to_numeric(frame[column], errors="coerce")
    return frame


def _positive(frame: pd.DataFrame, columns) -> pd.DataFrame:
    """The rows whose `columns` are all finite and > 0 (what a log axis can show)."""
    values = frame[list(columns)].to_numpy(dtype=float)
    keep = np.isfinite(values).all(axis=1) & (values > 0).all(axis=1)
    return frame[keep]


def _ratio(x: float) -> str:
    return f"{x:.2g}x" if x < 10 else f"{x:.0f}x"


def _ratio_range(values: pd.Series) -> str:
    """"2.5x" for one value or equal ones, else "1.4x to 13x (median 3.1x over 5 passes)"."""
    low, high = _ratio(values.min()), _ratio(values.max())
    if low == high:
        return low
    return f"{low} to {high} (median {_ratio(values.median())} over {len(values)} passes)"


def _require(frame: pd.DataFrame, columns, function: str) -> bool:
    """Whether `frame` has rows; raises when it has rows but lacks one of `columns`."""
    if len(frame) == 0:
        return False
    missing = [c for c in columns if c not in frame]
    if missing:
        raise ValueError(f"foxcute.lab.figures.{function}: the table lacks the column(s) {missing}")
    return True


def _us(x: float) -> str:
    return f"{x:.3g}" if x < 1000 else f"{x:,.0f}"


def roofline(records: pd.DataFrame, copy_TBps: float, tf32_TFLOPs: float, fp32_TFLOPs: float,
             path=None) -> tuple[Figure, str]:
    """Achieved TFLOP/s against arithmetic intensity (flops / bytes_moved), one point per row
    of `records` (columns layer, pass, label, impl, time_us, bytes_moved, flops; label may be
    missing), its pass named above the pass's points and its implementation by legend, under
    the memory roof `copy_TBps` (TB/s) and the compute roofs `tf32_TFLOPs`, `fp32_TFLOPs`.
    The sentence: how many points are memory-bound (left of the FP32 ridge) and how close to
    its roof (the lower of the memory and TF32 roofs at its intensity) the best and the median
    CuTe point come."""
    title = "Roofline: achieved TFLOP/s against arithmetic intensity"
    roofs = {"copy_TBps": copy_TBps, "tf32_TFLOPs": tf32_TFLOPs, "fp32_TFLOPs": fp32_TFLOPs}
    bad = {k: v for k, v in roofs.items() if not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0)}
    if bad:
        raise ValueError(f"foxcute.lab.figures.roofline: the roofs must be finite and positive, got {bad}")
    needed = ["layer", "pass", "impl", "time_us", "bytes_moved", "flops"]
    if not _require(records, needed, "roofline"):
        return _no_data(title, "roofline points", path)
    frame = _positive(_numeric(records, needed[3:]), needed[3:])
    if frame.empty:
        return _no_data(title, "roofline points (rows with positive time, bytes and FLOPs)", path)
    intensity = (frame["flops"] / frame["bytes_moved"]).to_numpy(dtype=float)
    achieved = (frame["flops"] / (frame["time_us"] * 1e-6) / 1e12).to_numpy(dtype=float)
    roof = np.minimum(copy_TBps * intensity, tf32_TFLOPs)
    share = achieved / roof
    names = [pass_name(r["layer"], r["pass"], r.get("label")) for _, r in frame.iterrows()]
    impls = frame["impl"].astype(str).to_numpy()

    fig, ax = plt.subplots(figsize=(10, 7))
    ridges = {"TF32": tf32_TFLOPs / copy_TBps, "FP32": fp32_TFLOPs / copy_TBps}
    lo = min(intensity.min(), min(ridges.values())) / 3
    hi = max(intensity.max(), max(ridges.values())) * 3
    span = np.logspace(np.log10(lo), np.log10(hi), 200)
    below = span <= ridges["TF32"]  # the memory roof up to the highest compute roof
    ax.plot(span[below], copy_TBps * span[below], "k-", lw=1.5,
            label=f"memory roof: measured copy {copy_TBps:.3g} TB/s")
    for (name, peak), style in zip((("TF32 tensor cores", tf32_TFLOPs), ("FP32", fp32_TFLOPs)), ("--", ":")):
        at = span >= peak / copy_TBps
        ax.plot(span[at], np.full(at.sum(), peak), "k" + style, lw=1.2, label=f"{name} roof {peak:.3g} TFLOP/s")
        ax.annotate(f"{name} ridge {peak / copy_TBps:.3g} FLOP/B", (peak / copy_TBps, peak),
                    textcoords="offset points", xytext=(8, -12), fontsize=8)
    colours = {impl: f"C{i % 10}" for i, impl in enumerate(dict.fromkeys(impls))}
    for impl in colours:
        at = impls == impl
        ax.scatter(intensity[at], achieved[at], marker=FAMILY_MARKERS[family(impl)], color=colours[impl],
                   s=40, label=impl, zorder=3)
    for name in dict.fromkeys(names):  # a pass's points share one intensity: named once, above the highest
        at = np.array([n == name for n in names])
        ax.annotate(name, (intensity[at].max(), achieved[at].max()), textcoords="offset points", xytext=(0, 7),
                    rotation=35, rotation_mode="anchor", fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(min(achieved.min(), copy_TBps * lo) / 3, tf32_TFLOPs * 3)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    _save(fig, path)

    bound = int((intensity < ridges["FP32"]).sum())
    sentence = (f"{bound} of {len(frame)} points lie left of the FP32 ridge ({ridges['FP32']:.3g} FLOP/B), "
                f"so {'every pass is' if bound == len(frame) else 'those passes are'} bound by memory, not compute")
    cute = np.array([family(i) == "cute" for i in impls])
    if cute.any():
        best = int(np.flatnonzero(cute)[np.argmax(share[cute])])
        sentence += (f"; the best CuTe point, {impls[best]} on {names[best]}, reaches {share[best]:.0%} of its roof "
                     f"and the median CuTe point {np.median(share[cute]):.0%}.")
    else:
        best = int(np.argmax(share))
        sentence += f"; the closest to its roof is {impls[best]} on {names[best]} at {share[best]:.0%} of it."
    return fig, sentence


def _before_after_table(records: pd.DataFrame) -> pd.DataFrame:
    """Per layer pass (rows, in first-seen order) the time of each BEFORE_AFTER_GROUPS group
    (NaN where missing) and which implementation the two "best" groups took."""
    frame = _numeric(records, ["time_us", "floor_us"])
    frame["case"] = [pass_name(r["layer"], r["pass"], r.get("label")) for _, r in frame.iterrows()]
    timed = frame[np.isfinite(frame["time_us"]) & (frame["time_us"] > 0)]
    rows = {}
    for case in dict.fromkeys(frame["case"]):
        mine = timed[timed["case"] == case]
        row = {}
        for group, pick in (("naive", mine["impl"] == "naive"), ("torch eager", mine["impl"] == "torch_eager"),
                            ("best torch.compile", mine["impl"].map(is_torch_compile)),
                            ("best cute", mine["impl"].map(lambda i: family(i) == "cute"))):
            chosen = mine[pick.astype(bool)]
            if len(chosen):
                fastest = chosen.loc[chosen["time_us"].idxmin()]
                row[group], row[f"{group} impl"] = float(fastest["time_us"]), str(fastest["impl"])
        floors = frame.loc[(frame["case"] == case) & (frame["floor_us"] > 0), "floor_us"].dropna()
        if len(floors):
            row["floor"] = float(floors.iloc[0])
        rows[case] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    return table.reindex(columns=[c for g in BEFORE_AFTER_GROUPS for c in (g, f"{g} impl") if c in table])


def before_after(records: pd.DataFrame, path=None) -> tuple[Figure, str]:
    """Per layer pass, bars (log scale, labelled in us) of the naive, torch eager, best
    torch.compile (impl torch_compile* or torch_max_autotune) and best CuTe (impl cute*) times
    and the floor (floor_us), from `records` (columns layer, pass, label, impl, time_us,
    floor_us). Missing groups are left out. The sentence: the range of naive over best CuTe,
    best CuTe over the floor, and on how many passes CuTe beats the best torch.compile."""
    title = "Before and after: time per layer pass (log scale)"
    needed = ["layer", "pass", "impl", "time_us", "floor_us"]
    table = _before_after_table(records) if _require(records, needed, "before_after") else pd.DataFrame()
    groups = [g for g in BEFORE_AFTER_GROUPS if g in table]
    if table.empty or not groups or table[groups].notna().to_numpy().sum() == 0:
        return _no_data(title, "timed layer passes", path)
    timed = [g for g in groups if g != "floor"]
    table = table[table[timed].notna().any(axis=1)] if timed else table.iloc[:0]
    if table.empty:
        return _no_data(title, "timed layer passes", path)
    fig, ax = plt.subplots(figsize=(min(16.0, max(7.0, 0.3 * len(table) * len(groups) + 2)), 6))
    width = 0.8 / len(groups)
    positions = np.arange(len(table))
    for k, group in enumerate(groups):
        values = table[group].to_numpy(dtype=float)
        at = np.isfinite(values)
        xs = positions[at] + (k - (len(groups) - 1) / 2) * width
        bars = ax.bar(xs, values[at], width=width, color=GROUP_COLOURS[group], label=group,
                      hatch="//" if group == "floor" else None, edgecolor="white")
        ax.bar_label(bars, labels=[_us(v) for v in values[at]], fontsize=6.5, rotation=90, padding=2)
    ax.set_yscale("log")
    top = np.nanmax(table[groups].to_numpy(dtype=float))
    ax.set_ylim(top=top * 20)
    ax.set_xticks(positions, table.index, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time per call (us, log scale)")
    ax.set_title(title)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.legend(fontsize=8, ncol=len(groups), loc="upper left")
    _save(fig, path)

    parts = []
    if "best cute" in table and "naive" in table:
        speedup = (table["naive"] / table["best cute"]).dropna()
        if len(speedup):
            parts.append(f"the best CuTe implementation is {_ratio_range(speedup)} faster than naive")
    if "best cute" in table and "floor" in table:
        over = (table["best cute"] / table["floor"]).dropna()
        if len(over):
            worst = over.idxmax()
            parts.append(f"its time is {_ratio_range(over)} the floor"
                         + (f" (furthest: {worst})" if len(over) > 1 else ""))
    if "best cute" in table and "best torch.compile" in table:
        both = table[["best cute", "best torch.compile"]].dropna()
        if len(both):
            wins = int((both["best cute"] < both["best torch.compile"]).sum())
            parts.append(f"it beats the best torch.compile on {wins} of {len(both)} passes")
    if not parts:
        measured = ", ".join(g for g in groups)
        return fig, f"Only {measured} measured: no comparison between groups to draw."
    return fig, "Per layer pass, " + "; ".join(parts) + "."


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _overlap_length(lanes: dict[str, list[tuple[float, float]]]) -> float:
    """Time during which at least two lanes are busy (each lane's intervals merged first)."""
    edges = []
    for intervals in lanes.values():
        merged: list[list[float]] = []
        for start, stop in sorted(intervals):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], stop)
            else:
                merged.append([start, stop])
        edges += [(s, 1) for s, _ in merged] + [(e, -1) for _, e in merged]
    busy, last, overlap = 0, 0.0, 0.0
    for t, step in sorted(edges, key=lambda e: (e[0], e[1])):  # ends before starts at equal times
        if busy >= 2:
            overlap += t - last
        busy += step
        last = t
    return overlap


def lane_timeline(events: pd.DataFrame, path=None, *,
                  short: Callable[[str], str] | None = None) -> tuple[Figure, str]:
    """A Gantt chart of `events` (columns lane, name, start_us, duration_us; starts relative to
    anything, drawn from the earliest): one row per lane in first-seen order, one bar per kernel,
    labelled with its name (`short(name)` where given, cut to the bar's width) where the bar is
    wide enough. The sentence: the span, how much of it the lanes overlap, and the lane busy
    longest (its kernels' merged time)."""
    title = "Step timeline: kernels per lane"
    if not _require(events, ["lane", "name", "start_us", "duration_us"], "lane_timeline"):
        return _no_data(title, "kernel events", path)
    frame = _numeric(events, ["start_us", "duration_us"])
    frame = frame[np.isfinite(frame["start_us"]) & np.isfinite(frame["duration_us"]) & (frame["duration_us"] > 0)]
    if frame.empty:
        return _no_data(title, "kernel events", path)
    frame = frame.assign(start_us=frame["start_us"] - frame["start_us"].min())
    lanes = list(dict.fromkeys(frame["lane"].astype(str)))
    span = float((frame["start_us"] + frame["duration_us"]).max())
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.9 * len(lanes)))
    busy: dict[str, list[tuple[float, float]]] = {}
    for row_index, lane in enumerate(lanes):
        mine = frame[frame["lane"].astype(str) == lane]
        busy[lane] = [(s, s + d) for s, d in zip(mine["start_us"], mine["duration_us"])]
        ax.barh(row_index, mine["duration_us"], left=mine["start_us"], height=0.6,
                color=[f"C{i % 10}" for i in range(len(mine))], edgecolor="black", linewidth=0.4)
        for start, width, name in zip(mine["start_us"], mine["duration_us"], mine["name"].astype(str)):
            label = short(name) if short else name
            room = int(width / span * 150)  # characters that fit in the bar at this figure width
            if room >= 3:
                text = label if len(label) <= room else label[: room - 1] + "…"
                ax.text(start + width / 2, row_index, text, ha="center", va="center", fontsize=6.5, clip_on=True)
    ax.set_yticks(range(len(lanes)), lanes)
    ax.invert_yaxis()
    ax.set_xlim(0, span * 1.01)
    ax.set_xlabel("time from the first kernel's start (us)")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    _save(fig, path)

    busy_us = {lane: _union_length(intervals) for lane, intervals in busy.items()}
    critical = max(busy_us, key=busy_us.get)
    overlap = _overlap_length(busy) if len(lanes) > 1 else 0.0
    sentence = (f"The {len(frame)} kernels span {_us(span)} us; lane {critical} is busy longest "
                f"({_us(busy_us[critical])} us, {busy_us[critical] / span:.0%} of the span)")
    if len(lanes) > 1:
        sentence += f" and the lanes overlap for {_us(overlap)} us ({overlap / span:.0%} of the span)."
    else:
        sentence += ", the only lane."
    return fig, sentence


def batch_sweep(sweep: pd.DataFrame, path=None) -> tuple[Figure, str]:
    """Time per sample (time_us / B) against B, both logarithmic, one panel per case of `sweep`
    (columns case, impl, B, time_us, floor_us): a line per implementation, each labelled at its
    largest B, and the floor per sample (dashed). The sentence: per case, from which B on the
    best CuTe implementation beats the best torch.compile at every larger B measured, and how
    far the best CuTe is from the floor at the largest B."""
    title = "Batch sweep: time per sample"
    if not _require(sweep, ["case", "impl", "B", "time_us", "floor_us"], "batch_sweep"):
        return _no_data(title, "batch-sweep timings", path)
    frame = _positive(_numeric(sweep, ["B", "time_us"]), ["B", "time_us"])
    frame = frame.assign(floor_us=pd.to_numeric(frame["floor_us"], errors="coerce"))
    if frame.empty:
        return _no_data(title, "batch-sweep timings", path)
    cases = list(dict.fromkeys(frame["case"].astype(str)))
    columns = min(3, len(cases))
    rows = math.ceil(len(cases) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.2 * columns, 4.2 * rows), squeeze=False)
    impls = list(dict.fromkeys(frame["impl"].astype(str)))
    colours = {impl: f"C{i % 10}" for i, impl in enumerate(impls)}
    findings = []
    for ax, case in zip(axes.flat, cases):
        mine = frame[frame["case"].astype(str) == case]
        for impl, group in mine.groupby(mine["impl"].astype(str), sort=False):
            group = group.groupby("B")["time_us"].median()
            per_sample = group / group.index
            ax.plot(group.index, per_sample, marker=FAMILY_MARKERS[family(impl)], color=colours[impl], label=impl)
            ax.annotate(f"{impl} {per_sample.iloc[-1] * 1e3:.3g} ns", (group.index[-1], per_sample.iloc[-1]),
                        textcoords="offset points", xytext=(-2, 5), ha="right", fontsize=6.5, color=colours[impl])
        floor = mine[mine["floor_us"] > 0].groupby("B")["floor_us"].first()
        if len(floor):
            ax.plot(floor.index, floor / floor.index, "k--", lw=1, label="floor")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(case, fontsize=10)
        ax.set_xlabel("batch B")
        ax.set_ylabel("us per sample")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7)
        findings.append(_sweep_finding(case, mine, floor))
    for ax in list(axes.flat)[len(cases):]:
        ax.set_axis_off()
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)
    return fig, "Per case, " + "; ".join(findings) + "."


def _sweep_finding(case: str, mine: pd.DataFrame, floor: pd.Series) -> str:
    cute = mine[mine["impl"].map(lambda i: family(i) == "cute")].groupby("B")["time_us"].min()
    torch = mine[mine["impl"].map(is_torch_compile)].groupby("B")["time_us"].min()
    if cute.empty:
        return f"{case}: no CuTe time"
    both = pd.concat([cute.rename("cute"), torch.rename("torch")], axis=1).dropna()
    if both.empty:
        finding = f"{case}: no torch.compile time"
    else:
        wins = (both["cute"] < both["torch"]).to_numpy()
        losing = np.flatnonzero(~wins)
        if not len(losing):
            finding = f"{case}: CuTe beats torch.compile at every B"
        elif losing[-1] == len(wins) - 1:
            finding = f"{case}: CuTe still loses to torch.compile at the largest B={int(both.index[-1]):,}"
        else:
            finding = f"{case}: CuTe beats torch.compile from B={int(both.index[losing[-1] + 1]):,} on"
    largest = cute.index[-1]
    if largest in floor.index:
        finding += f" (CuTe {_ratio(cute.iloc[-1] / floor[largest])} the floor at B={int(largest):,})"
    return finding


def error_vs_tolerance(errors: pd.DataFrame, path=None) -> tuple[Figure, str]:
    """Per (case, output, precision) of `errors` (columns case, output, precision, rel_err,
    elem_err, tolerance): rel_err (circle) and elem_err (cross) on a log scale, coloured by
    precision, with each precision's tolerance as a horizontal line. An output passes when its
    rel_err (the contract's measure, docs/layers.md section 8) is at most its tolerance; a NaN
    rel_err is not counted. The sentence: how many pass, and the largest rel_err and elem_err
    relative to their tolerance."""
    title = "Error against tolerance per output"
    if not _require(errors, ["case", "output", "precision", "rel_err", "elem_err", "tolerance"], "error_vs_tolerance"):
        return _no_data(title, "errors", path)
    frame = _numeric(errors, ["rel_err", "elem_err", "tolerance"])
    frame = frame[frame[["rel_err", "elem_err"]].notna().any(axis=1)]
    if frame.empty:
        return _no_data(title, "errors", path)
    frame = frame.assign(precision=frame["precision"].astype(str),
                         where=[f"{c}: {o}" for c, o in zip(frame["case"], frame["output"])])
    values = frame[["rel_err", "elem_err", "tolerance"]].to_numpy(dtype=float)
    shown = values[np.isfinite(values) & (values > 0)]
    bottom = 10.0 ** (math.floor(math.log10(shown.min())) - 1) if len(shown) else 1e-16
    top = 10.0 ** (math.ceil(math.log10(shown.max())) + 1) if len(shown) else 1.0
    places = list(dict.fromkeys(frame["where"]))
    precisions = list(dict.fromkeys(frame["precision"]))
    colours = {p: f"C{i % 10}" for i, p in enumerate(precisions)}
    fig, ax = plt.subplots(figsize=(max(7.0, 0.45 * len(places) + 3), 5.5))
    offsets = {p: (k - (len(precisions) - 1) / 2) * 0.25 for k, p in enumerate(precisions)}
    for _, row in frame.iterrows():
        x = places.index(row["where"]) + offsets[row["precision"]]
        for column, marker, shift in (("rel_err", "o", -0.04), ("elem_err", "x", 0.04)):
            value = row[column]
            if np.isnan(value):
                continue
            if value <= 0 or not np.isfinite(value):
                y, text = (bottom, "0") if value == 0 else (top, "inf" if value > 0 else "<0")
                ax.annotate(text, (x + shift, y), textcoords="offset points", xytext=(3, 0), fontsize=6.5)
            else:
                y = value
            ax.scatter(x + shift, y, marker=marker, color=colours[row["precision"]], s=30, zorder=3)
    for precision in precisions:
        for tolerance in frame.loc[frame["precision"] == precision, "tolerance"].dropna().unique():
            ax.axhline(tolerance, color=colours[precision], ls="--", lw=1,
                       label=f"{precision} tolerance {tolerance:.0e}")
    for precision in precisions:
        ax.scatter([], [], marker="s", color=colours[precision], label=precision)
    ax.scatter([], [], marker="o", color="0.3", label="rel_err (norm-wise)")
    ax.scatter([], [], marker="x", color="0.3", label="elem_err (element-wise)")
    ax.set_yscale("log")
    ax.set_ylim(bottom / 2, top * 2)
    ax.set_xticks(range(len(places)), places, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("error relative to the float64 reference (log scale)")
    ax.set_title(title)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    _save(fig, path)

    judged = frame[frame["rel_err"].notna() & frame["tolerance"].notna()]
    if judged.empty:
        return fig, f"{len(frame)} outputs shown, none with both a rel_err and a tolerance to judge it by."
    passed = int((judged["rel_err"] <= judged["tolerance"]).sum())
    each = " (each precision counted apart)" if judged["precision"].nunique() > 1 else ""
    sentence = f"{passed} of {len(judged)} outputs{each} are within their tolerance"
    for column, what in (("rel_err", "rel_err"), ("elem_err", "elem_err")):
        share = (judged[column] / judged["tolerance"]).dropna()
        if len(share):
            worst = judged.loc[share.idxmax()]
            sentence += (f"; the largest {what} is {_share(share.max())} its tolerance "
                         f"({worst['where']}, {worst['precision']})")
    return fig, sentence + "."


def _share(x: float) -> str:
    if not np.isfinite(x):
        return "infinitely above"
    return f"{x:.2g}x"


def training_curves(curves: pd.DataFrame, path=None) -> tuple[Figure, str]:
    """One panel per curve, one line per training setup, against the learner step, from
    `curves` (columns setup, step, curve, value: 04_training's training_curves.csv in long
    form). The sentence: the largest gap between two setups' values at the same step, over
    the curve's largest magnitude, and where it is."""
    title = "Training curves by setup"
    needed = ["setup", "step", "curve", "value"]
    frame = _numeric(curves, ["step", "value"]) if _require(curves, needed, "training_curves") else pd.DataFrame()
    if not frame.empty:
        frame = frame[np.isfinite(frame["step"]) & np.isfinite(frame["value"])]
    if frame.empty:
        return _no_data(title, "training curves", path)
    names = list(dict.fromkeys(frame["curve"]))
    columns = min(4, len(names))
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    worst = None  # (gap, curve, setup a, setup b)
    for ax, name in zip(axes.flat, names):
        mine = frame[frame["curve"] == name]
        wide = mine.pivot_table(index="step", columns="setup", values="value", sort=False)
        for k, setup in enumerate(wide.columns):
            ax.plot(wide.index, wide[setup], label=setup, lw=1.6 if k == 0 else 1.0,
                    ls="-" if k == 0 else "--")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("learner step", fontsize=8)
        ax.tick_params(labelsize=7)
        scale = np.nanmax(np.abs(wide.to_numpy(dtype=float)))
        for i, a in enumerate(wide.columns):
            for b in wide.columns[i + 1:]:
                gap = np.nanmax(np.abs(wide[a] - wide[b]).to_numpy(dtype=float), initial=0.0) / (scale or 1.0)
                if worst is None or gap > worst[0]:
                    worst = (gap, name, a, b)
    for ax in list(axes.flat)[len(names):]:
        ax.set_axis_off()
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    _save(fig, path)
    setups = frame["setup"].nunique()
    steps = frame["step"].nunique()
    if worst is None:
        return fig, f"One setup ({frame['setup'].iloc[0]}) over {steps} steps: no second run to compare it with."
    gap, name, a, b = worst
    return fig, (f"{setups} setups over {steps} steps: the largest gap between two of them at one step is "
                 f"{gap:.2g} of the curve's largest magnitude ({name}, {a} against {b}).")


def step_times(records: pd.DataFrame, path=None) -> tuple[Figure, str]:
    """Bars (log scale, labelled in us) of one whole training step's time per implementation,
    from `records` (columns impl, time_us, timing). The sentence: the fastest and how many times
    slower each other implementation is."""
    title = "One training step (forward, backward, Adam), log scale"
    frame = _numeric(records, ["time_us"]) if _require(records, ["impl", "time_us", "timing"], "step_times") \
        else pd.DataFrame()
    if not frame.empty:
        frame = _positive(frame, ["time_us"])
    if frame.empty:
        return _no_data(title, "timed training steps", path)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(frame) + 2), 4.5))
    colours = [GROUP_COLOURS["best cute"] if str(i).startswith("foxcute") else GROUP_COLOURS["torch eager"]
               for i in frame["impl"]]
    bars = ax.bar(range(len(frame)), frame["time_us"], color=colours,
                  hatch=None, edgecolor="white")
    ax.bar_label(bars, labels=[_us(v) for v in frame["time_us"]], fontsize=8, padding=2)
    ax.set_xticks(range(len(frame)), [f"{i}\n({t})" for i, t in zip(frame["impl"], frame["timing"])], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylim(top=frame["time_us"].max() * 10)
    ax.set_ylabel("time per step (us, log scale)")
    ax.set_title(title)
    ax.grid(True, axis="y", which="major", alpha=0.3)
    _save(fig, path)
    fastest = frame.loc[frame["time_us"].idxmin()]
    others = [f"{r.impl} {_ratio(r.time_us / fastest.time_us)}" for r in frame.itertuples() if r.impl != fastest.impl]
    if not others:
        return fig, f"Only {fastest.impl} timed: {_us(fastest.time_us)} us a step."
    return fig, (f"Fastest: {fastest.impl} at {_us(fastest.time_us)} us a step; the others take "
                 + ", ".join(others) + " its time.")
